"""The plan from the environment: RUBICK_PLAN and the per-field variables, their
agreement, the refusals (a PlanError, exit 2), and the plan-string vectors shared with
rubick's parser (data/plan-vectors.json)."""

import json
import os
import signal
import subprocess
import sys

import pytest
from helpers import REPO, need, run_python

from rubick import Plan, PlanError, PlanFields, parse_plan

with open(os.path.join(REPO, "data", "plan-vectors.json")) as f:
    VECTORS = json.load(f)

#: The fields of a vector's ``plan``.
FIELDS = ("dp", "tp", "pp", "micro_batch", "ga", "zero", "offload", "recompute", "sp", "vp")


def test_every_variable_of_the_launcher_is_read():
    env = {
        "RUBICK_DP": "2",
        "RUBICK_TP": "2",
        "RUBICK_PP": "1",
        "RUBICK_ZERO": "3",
        "RUBICK_OFFLOAD": "all",
        "RUBICK_GA": "4",
        "RUBICK_GC": "1",
        "RUBICK_MICRO_BATCH": "8",
        "RUBICK_GPUS": "4",
        "RUBICK_NODES": "2",
        "RUBICK_NODE_RANK": "1",
        "RUBICK_CPUS": "32",
        "RUBICK_JOB": "gpt",
        "RUBICK_METRICS": "/m.jsonl",
        "RUBICK_CHECKPOINT_DIR": "/ckpt",
        "RUBICK_DEEPSPEED_CONFIG": "/ds.json",
        "RUBICK_STOP_SIGNAL": "USR2",
    }
    p = Plan.from_env(env)
    assert (p.dp, p.tp, p.pp, p.zero, p.offload, p.ga, p.gc, p.micro_batch) == (2, 2, 1, 3, "all", 4, True, 8)
    assert (p.gpus, p.nodes, p.node_rank, p.cpus, p.job) == (4, 2, 1, 32, "gpt")
    assert (p.metrics, p.checkpoint_dir, p.deepspeed_config) == ("/m.jsonl", "/ckpt", "/ds.json")
    assert p.stop_signal == signal.SIGUSR2
    assert p.global_batch == 64 and p.world_size == 4
    assert p.code() == "dp2-tp2-pp1-mb8-ga4-z3-offall-gc" == p.name


def test_each_worker_process_has_its_share_of_the_nodes_cores():
    """issue 42: `RUBICK_CPUS` is the run's cores in all; a worker's are its node's over
    the node's workers (`RUBICK_CPUS_PER_PROCESS`, which rubick sets; else computed the
    same way)."""
    dp2 = {"RUBICK_PLAN": "dp2-tp1-pp1-mb8-ga1", "RUBICK_CPUS": "2"}
    assert Plan.from_env(dp2).cpus_per_process == 1
    assert Plan.from_env(dict(dp2, RUBICK_CPUS_PER_PROCESS="3")).cpus_per_process == 3
    assert Plan.from_env(dict(dp2, LOCAL_WORLD_SIZE="1")).cpus_per_process == 2  # one of them on this node
    two_nodes = {"RUBICK_PLAN": "dp8-tp1-pp1-mb1-ga1", "RUBICK_NODES": "2", "RUBICK_CPUS": "64"}
    assert Plan.from_env(two_nodes).cpus_per_process == 8
    assert Plan.from_env(dict(dp2, RUBICK_CPUS="1")).cpus_per_process == 1  # fewer cores than workers
    assert Plan.from_env({"RUBICK_PLAN": "dp2-tp1-pp1-mb8-ga1"}).cpus_per_process == 0  # not said
    with pytest.raises(PlanError, match="RUBICK_CPUS_PER_PROCESS"):
        Plan.from_env(dict(dp2, RUBICK_CPUS_PER_PROCESS="two"))


def test_a_worker_sets_its_threads_from_the_plan_unless_the_user_did():
    need("torch")
    # Made before torch is imported (the callbacks' and Run's place) or after it.
    for made in ("rubick.Run()\nimport torch", "import torch\nrubick.integrations.hf.RubickCallback()"):
        code = f"import rubick, rubick.integrations.hf\n{made}\nprint(torch.get_num_threads())"
        # (torch's own default is the machine's cores, and it takes no more from the
        # environment: the counts stay at 1 and 2.)
        for env, threads in (
            ({"RUBICK_CPUS": "2", "RUBICK_PLAN": "dp2-tp1-pp1-mb1-ga1"}, "1"),
            ({"RUBICK_CPUS": "2", "RUBICK_CPUS_PER_PROCESS": "1", "OMP_NUM_THREADS": "2"}, "2"),  # the user's
        ):
            run = run_python(code, unset=("OMP_NUM_THREADS", "RUBICK_CPUS_PER_PROCESS", "LOCAL_WORLD_SIZE"), **env)
            assert (run.returncode, run.stdout.strip()) == (0, threads), (made, env, run.stderr[-2000:])


def test_a_field_missing_from_its_variable_comes_from_the_plan_string():
    p = Plan.from_env({"RUBICK_PLAN": "dp2-tp1-pp1-mb4-ga2-z1-offopt-gc", "RUBICK_GA": "2"})
    assert (p.dp, p.micro_batch, p.ga, p.zero, p.offload, p.gc) == (2, 4, 2, 1, "optimizer", True)
    # A partial plan string names only what it names: the variables add the rest.
    p = Plan.from_env({"RUBICK_PLAN": "dp2-mb4", "RUBICK_GA": "3", "RUBICK_ZERO": "1"})
    assert (p.dp, p.micro_batch, p.ga, p.zero) == (2, 4, 3, 1)
    assert parse_plan("dp2-mb4") == PlanFields(dp=2, micro_batch=4)
    # A complete one (the launcher's form) says ZeRO 0, no offload, no checkpointing.
    assert parse_plan("dp4-tp2-pp2-mb1-ga8") == PlanFields(
        dp=4, tp=2, pp=2, micro_batch=1, ga=8, zero=0, offload="none", recompute="none", sp=False, vp=1
    )


def test_no_variable_is_a_single_process_run():
    p = Plan.from_env({})
    assert (p.world_size, p.global_batch, p.metrics, p.checkpoint_dir) == (1, 1, None, None)
    assert p.stop_signal == signal.SIGUSR1


@pytest.mark.parametrize(
    "env, names",
    [
        ({"RUBICK_DP": "two"}, "RUBICK_DP"),
        ({"RUBICK_DP": "0"}, "RUBICK_DP"),
        ({"RUBICK_ZERO": "4"}, "RUBICK_ZERO"),
        ({"RUBICK_OFFLOAD": "disk", "RUBICK_ZERO": "1"}, "RUBICK_OFFLOAD"),
        ({"RUBICK_OFFLOAD": "optimizer"}, "RUBICK_OFFLOAD"),
        ({"RUBICK_OFFLOAD": "all", "RUBICK_ZERO": "2"}, "RUBICK_OFFLOAD"),
        ({"RUBICK_GC": "maybe"}, "RUBICK_GC"),
        ({"RUBICK_STOP_SIGNAL": "SIGNOPE"}, "RUBICK_STOP_SIGNAL"),
        ({"RUBICK_PLAN": "dp2-fast"}, "RUBICK_PLAN"),
        ({"RUBICK_NODES": "2", "RUBICK_NODE_RANK": "2"}, "RUBICK_NODE_RANK"),
    ],
)
def test_a_bad_value_is_an_error_naming_its_variable(env, names):
    with pytest.raises(PlanError, match=names):
        Plan.from_env(env)


def test_the_world_must_match_the_plan():
    p = Plan.from_env({"RUBICK_DP": "2", "RUBICK_TP": "2"})
    p.check_world(4)
    with pytest.raises(PlanError, match="does not match the 2 process"):
        p.check_world(2)


def test_importing_rubick_leaves_the_exception_hook_alone():
    run = run_python("import sys\nhook = sys.excepthook\nimport rubick.integrations\nassert sys.excepthook is hook\n")
    assert run.returncode == 0, run.stderr


def test_an_uncaught_plan_error_exits_2(tmp_path):
    marker = tmp_path / "atexit-ran"
    run = run_python(
        "import atexit, rubick\nrubick.install_exit_hook()\n"
        f"atexit.register(lambda: open({str(marker)!r}, 'w').close())\nrubick.Plan.from_env()\n",
        RUBICK_DP="two",
    )
    assert run.returncode == 2, run.stderr
    assert "RUBICK_DP='two'" in run.stderr and "Traceback" in run.stderr
    assert marker.exists(), "Python finalized as for sys.exit (atexit handlers ran)"
    # Without the hook, Python's own exit 1.
    run = run_python("import rubick\nrubick.Plan.from_env()\n", RUBICK_DP="two")
    assert run.returncode == 1 and "RUBICK_DP='two'" in run.stderr, run.stderr
    # Inside Run, as a script would: the same.
    run = run_python("import rubick\nwith rubick.Run() as run:\n    pass\n", RUBICK_STOP_SIGNAL="SIGKILL")
    assert run.returncode == 2 and "SIGKILL cannot be caught" in run.stderr, run.stderr
    # Other errors keep Python's exit 1.
    run = run_python("import rubick\nraise RuntimeError('not a plan')\n")
    assert run.returncode == 1 and "not a plan" in run.stderr


def test_a_per_field_variable_contradicting_rubick_plan_is_an_error():
    with pytest.raises(PlanError, match=r"RUBICK_GA=3 contradicts RUBICK_PLAN=dp2-tp1-pp1-mb4-ga2"):
        Plan.from_env({"RUBICK_PLAN": "dp2-tp1-pp1-mb4-ga2", "RUBICK_GA": "3"})
    # The launcher's complete form leaves ZeRO 0, no offload and no checkpointing out.
    for var, value in (("RUBICK_ZERO", "1"), ("RUBICK_GC", "1"), ("RUBICK_OFFLOAD", "optimizer")):
        with pytest.raises(PlanError, match=f"{var}={value} contradicts RUBICK_PLAN"):
            Plan.from_env({"RUBICK_PLAN": "dp2-tp1-pp1-mb4-ga2", var: value})
    # What the launcher writes (every variable, agreeing) is fine.
    env = {
        "RUBICK_PLAN": "dp2-tp1-pp1-mb4-ga2-z1-offopt-gc",
        "RUBICK_DP": "2",
        "RUBICK_TP": "1",
        "RUBICK_PP": "1",
        "RUBICK_ZERO": "1",
        "RUBICK_OFFLOAD": "optimizer",
        "RUBICK_GA": "2",
        "RUBICK_GC": "1",
        "RUBICK_MICRO_BATCH": "4",
        "RUBICK_GPUS": "2",
    }
    assert Plan.from_env(env).code() == "dp2-tp1-pp1-mb4-ga2-z1-offopt-gc"
    env = {"RUBICK_PLAN": "dp1-tp1-pp1-mb4-ga2", "RUBICK_ZERO": "0", "RUBICK_OFFLOAD": "none", "RUBICK_GC": "0"}
    assert Plan.from_env(env).code() == "dp1-tp1-pp1-mb4-ga2"
    # The pytorch reference script refuses the same way (exit 2).
    need("torch")
    run = subprocess.run(
        [sys.executable, os.path.join(REPO, "examples", "pytorch", "train.py"), "--iterations", "1"],
        env=dict(os.environ, RUBICK_PLAN="dp1-tp1-pp1-mb16-ga1", RUBICK_GA="2"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and "RUBICK_GA=2 contradicts RUBICK_PLAN" in run.stderr, run.stderr[-2000:]


@pytest.mark.parametrize(
    "env, message",
    [
        # The plan string and a per-field variable disagree.
        ({"RUBICK_PLAN": "dp2-tp1-pp1-mb4-ga2", "RUBICK_DP": "1"}, r"RUBICK_DP=1 contradicts RUBICK_PLAN=dp2-tp1-pp1"),
        # 4 processes on the 1 GPU the run was given.
        (
            {"RUBICK_DP": "4", "RUBICK_GPUS": "1"},
            r"RUBICK_GPUS=1 but the plan needs dp\*tp\*pp = 4\*1\*1 = 4 .*RUBICK_DP",
        ),
        ({"RUBICK_PLAN": "dp4-tp1-pp1-mb1-ga1", "RUBICK_GPUS": "1"}, r"RUBICK_GPUS=1 .*dp from RUBICK_PLAN"),
        # Numbers out of range (a 23-digit DP), in a variable or in the plan string.
        ({"RUBICK_DP": "1" * 23}, r"RUBICK_DP=1{23}: must be at most 4294967295"),
        ({"RUBICK_PLAN": "dp" + "9" * 23 + "-tp1"}, r"RUBICK_PLAN: .*dp must be 1 to 4294967295"),
        ({"RUBICK_PLAN": "dp0-tp1"}, r"RUBICK_PLAN: 'dp0'"),
        ({"RUBICK_DP": "65536", "RUBICK_TP": "65536", "RUBICK_PP": "2"}, r"dp\*tp\*pp .* must be at most"),
        ({"RUBICK_DP": "1_000"}, r"RUBICK_DP='1_000': expected an integer"),
        ({"RUBICK_CPUS": "9" * 30}, r"RUBICK_CPUS=9+: must be at most"),
        ({"RUBICK_PLAN": "dp2-dp4"}, r"names dp twice"),
        # A stop signal no process can catch.
        ({"RUBICK_STOP_SIGNAL": "SIGKILL"}, r"RUBICK_STOP_SIGNAL='SIGKILL': SIGKILL cannot be caught"),
        ({"RUBICK_STOP_SIGNAL": "9"}, r"SIGKILL cannot be caught"),
        ({"RUBICK_STOP_SIGNAL": "STOP"}, r"SIGSTOP cannot be caught"),
    ],
)
def test_the_plan_refuses_contradictions_mismatches_bounds_and_uncatchable_signals(env, message):
    with pytest.raises(PlanError, match=message):
        Plan.from_env(env)


def test_a_stop_signal_kill_is_a_plan_error_not_an_os_error():
    from rubick.plan import stop_signal

    with pytest.raises(PlanError, match="cannot be caught"):
        stop_signal({"RUBICK_STOP_SIGNAL": "SIGKILL"})
    assert stop_signal({"RUBICK_STOP_SIGNAL": "USR2"}) == signal.SIGUSR2
    # And a script given one exits 2 naming it, before anything else.
    run = run_python("import rubick\nrubick.Run()\n", RUBICK_STOP_SIGNAL="SIGKILL")
    assert run.returncode == 2 and "RUBICK_STOP_SIGNAL" in run.stderr and "OSError" not in run.stderr


def test_a_plan_that_agrees_with_its_gpus_still_runs():
    # The checks refuse only what is wrong: RUBICK_GPUS = dp*tp*pp is fine.
    p = Plan.from_env({"RUBICK_PLAN": "dp2-tp2-pp1-mb1-ga1", "RUBICK_GPUS": "4", "RUBICK_DP": "2"})
    assert (p.world_size, p.gpus) == (4, 4)


@pytest.mark.parametrize("case", VECTORS["accepted"], ids=lambda c: c["text"])
def test_a_plan_string_reads_and_writes_as_rubick_does(case):
    named = {k: getattr(parse_plan(case["text"]), k) for k in FIELDS}
    assert {k: v for k, v in named.items() if v is not None}.items() <= case["plan"].items()
    plan = Plan.from_env({"RUBICK_PLAN": case["text"]})
    assert {k: getattr(plan, k) for k in FIELDS} == case["plan"]
    assert plan.code() == case["canonical"]
    # The canonical form is complete: it names every field.
    assert {k: getattr(parse_plan(case["canonical"]), k) for k in FIELDS} == case["plan"]


@pytest.mark.parametrize("case", VECTORS["rejected"], ids=lambda c: c["text"])
def test_a_plan_string_rubick_refuses_is_refused(case):
    with pytest.raises(PlanError, match=r"RUBICK_PLAN|RUBICK_OFFLOAD"):
        Plan.from_env({"RUBICK_PLAN": case["text"]})


@pytest.mark.parametrize("case", VECTORS["python_only"], ids=lambda c: c["text"] or "empty")
def test_a_plan_string_rubick_never_launches_still_runs_by_hand(case):
    plan = Plan.from_env({"RUBICK_PLAN": case["text"]})
    assert {k: getattr(plan, k) for k in FIELDS} == case["plan"]


def test_the_newer_dimensions_come_from_their_variables_and_agree_with_the_plan_string():
    env = {"RUBICK_PLAN": "dp1-tp2-pp2-mb1-ga4-vp2-sp-sel", "RUBICK_RECOMPUTE": "selective", "RUBICK_SP": "1"}
    env.update({"RUBICK_VP": "2", "RUBICK_GC": "0"})
    p = Plan.from_env(env)
    assert (p.recompute, p.sp, p.vp, p.gc) == ("selective", True, 2, False)
    assert p.code() == "dp1-tp2-pp2-mb1-ga4-vp2-sp-sel"
    # The variables alone, as a launcher that writes no plan string would.
    p = Plan.from_env({"RUBICK_TP": "2", "RUBICK_PP": "2", "RUBICK_GA": "2", "RUBICK_SP": "1", "RUBICK_VP": "2"})
    assert (p.sp, p.vp, p.recompute) == (True, 2, "none")
    p = Plan.from_env({"RUBICK_GC": "1"})
    assert (p.recompute, p.gc) == ("full", True)
    for extra, var in (
        ({"RUBICK_RECOMPUTE": "full"}, "RUBICK_RECOMPUTE"),
        ({"RUBICK_GC": "1"}, "RUBICK_GC"),
        ({"RUBICK_SP": "0"}, "RUBICK_SP"),
        ({"RUBICK_VP": "3"}, "RUBICK_VP"),
        ({"RUBICK_RECOMPUTE": "some"}, "RUBICK_RECOMPUTE"),
        ({"RUBICK_SP": "maybe"}, "RUBICK_SP"),
    ):
        with pytest.raises(PlanError, match=var):
            Plan.from_env({"RUBICK_PLAN": "dp1-tp2-pp2-mb1-ga4-vp2-sp-sel", **extra})
    with pytest.raises(PlanError, match="needs tp > 1"):
        Plan.from_env({"RUBICK_SP": "1"})


@pytest.mark.parametrize("name", ["SIGCHLD", "SIGSEGV", "CHLD", "17", "11", "SIGHUP", "SIGALRM"])
def test_only_the_contracts_stop_signals_are_accepted(name):
    """issue 40: "`Plan.from_env` accepts SIGCHLD/SIGSEGV as the stop signal"."""
    with pytest.raises(PlanError, match=f"RUBICK_STOP_SIGNAL={name!r}: .* not one of the contract's stop signals"):
        Plan.from_env({"RUBICK_STOP_SIGNAL": name})


@pytest.mark.parametrize(
    "name, sig",
    [
        ("", signal.SIGUSR1),
        ("SIGUSR1", signal.SIGUSR1),
        ("usr2", signal.SIGUSR2),
        ("SIGTERM", signal.SIGTERM),
        ("INT", signal.SIGINT),
        (str(int(signal.SIGUSR1)), signal.SIGUSR1),
        (str(int(signal.SIGTERM)), signal.SIGTERM),
    ],
)
def test_the_contracts_stop_signals_are_accepted_by_name_or_number(name, sig):
    assert Plan.from_env({"RUBICK_STOP_SIGNAL": name}).stop_signal == sig
