"""Issue 30's Python items: the adapters cannot be misused silently.

3. a user's ``output_dir`` never replaces the run's checkpoint directory;
4. a torchrun-launched script exits 0 after a stop (``python -m rubick.torchrun``);
5. an uncaught ``PlanError`` exits 2; ``RUBICK_<FIELD>`` contradicting ``RUBICK_PLAN``
   is an error; ``import rubick.hf`` is fast; old Trainer checkpoints are pruned;
12. contradictions, world-size mismatches, out-of-range numbers and an uncatchable stop
    signal are clear ``PlanError``s.
"""

import os
import signal
import subprocess
import sys
import time

import pytest

from helpers import PACKAGE, need, with_package

from rubick import Plan, PlanError

REPO = os.path.dirname(PACKAGE)


# --- item 3 --------------------------------------------------------------------------


def test_item3_output_dir_cannot_replace_checkpoint_dir(tmp_path, capsys):
    need("torch", "transformers", "accelerate")
    import rubick.hf

    run_dir, theirs = str(tmp_path / "run-ckpt"), str(tmp_path / "their-out")
    plan = Plan.from_env({"RUBICK_PLAN": "dp1-tp1-pp1-mb4-ga2", "RUBICK_CHECKPOINT_DIR": run_dir})
    args = rubick.hf.training_arguments(plan, output_dir=theirs, max_steps=5, per_device_train_batch_size=8)
    assert args.output_dir == run_dir, "the run's checkpoint directory wins"
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (4, 2), "the plan's batch"
    err = capsys.readouterr().err
    assert f"training_arguments(output_dir={theirs!r}) ignored" in err and run_dir in err, err
    assert "training_arguments(per_device_train_batch_size=8) ignored" in err, err
    # resume_from_checkpoint pointing elsewhere is replaced by the run's newest (none yet).
    args = rubick.hf.training_arguments(plan, resume_from_checkpoint=str(tmp_path / "other" / "checkpoint-9"))
    assert args.resume_from_checkpoint is None
    assert "training_arguments(resume_from_checkpoint=" in capsys.readouterr().err
    # The run's own directory passed again: no warning.
    rubick.hf.training_arguments(plan, output_dir=run_dir)
    assert "ignored" not in capsys.readouterr().err
    # A plain run (no RUBICK_CHECKPOINT_DIR): the argument is used as given.
    args = rubick.hf.training_arguments(Plan.from_env({}), output_dir=theirs)
    assert args.output_dir == theirs and capsys.readouterr().err == ""


# --- item 4 --------------------------------------------------------------------------


def test_item4_torchrun_stop_exits_0(tmp_path):
    need("torch")
    # The example jobs launch through the package's launcher, torchrun's flags intact.
    for example in ("hf-trainer", "lightning", "torchrun-ddp"):
        text = open(os.path.join(REPO, "examples", example, "job.yaml")).read()
        assert '"rubick.torchrun"' in text or " rubick.torchrun," in text, example
        assert "--signals-to-handle" not in text and "PYTHONPATH: python" in text, example
    script = tmp_path / "train.py"
    script.write_text(
        "import os, signal, sys, time\n"
        "import rubick\n"
        "flag = rubick.StopFlag(rubick.Plan.from_env().stop_signal, signal.SIGTERM)\n"
        "if os.environ.get('IGNORE') == '1':\n"
        "    signal.signal(rubick.Plan.from_env().stop_signal, signal.SIG_IGN)\n"
        "rank = os.environ['RANK']\n"
        "open(os.environ['READY'] + rank, 'w').close()\n"
        "while not flag.requested:\n"
        "    time.sleep(0.05)\n"
        "print('worker', rank, 'stopped cleanly', flush=True)\n"
    )

    def run(**extra):
        ready = str(tmp_path / f"ready{len(extra)}-")
        env = with_package(dict(os.environ, READY=ready, OMP_NUM_THREADS="1", TORCH_ELASTIC_SHUTDOWN_TIMEOUT="3",
                                **extra))
        proc = subprocess.Popen([sys.executable, "-m", "rubick.torchrun", "--standalone", "--nproc-per-node=2",
                                 str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        start = time.time()
        while not all(os.path.exists(ready + r) for r in "01"):
            assert proc.poll() is None, proc.communicate()
            assert time.time() - start < 120, "the workers did not start"
            time.sleep(0.1)
        time.sleep(0.5)
        proc.send_signal(signal.SIGUSR1)  # as rubick: the stop signal to the launcher (it relays it)
        out, err = proc.communicate(timeout=120)
        return proc.returncode, out, err

    code, out, err = run()
    assert code == 0, err[-3000:]
    assert out.count("stopped cleanly") == 2
    assert "SignalException" not in err and "Traceback" not in err, err[-3000:]
    assert "stopped by SIGUSR1: all 2 worker(s) exited 0; exit 0" in err
    # Workers that ignore the stop are killed after torchrun's shutdown timeout: not a
    # clean stop, torchrun's failure is kept.
    code, out, err = run(IGNORE="1")
    assert code == 1 and "not every worker exited 0" in err, (code, err[-3000:])


def test_item4_torchrun_passes_the_contract_exit_codes_through(tmp_path):
    need("torch")
    script = tmp_path / "bad.py"
    script.write_text("import rubick\nrubick.Plan.from_env().check_world(2)\n")
    env = with_package(dict(os.environ, RUBICK_PLAN="dp4-tp1-pp1-mb1-ga1", OMP_NUM_THREADS="1"))
    run = subprocess.run([sys.executable, "-m", "rubick.torchrun", "--standalone", "--nproc-per-node=2", str(script)],
                         env=env, capture_output=True, text=True, timeout=180)
    assert run.returncode == 2, run.stderr[-3000:]
    assert "the first worker to fail exited 2" in run.stderr


# --- item 5 --------------------------------------------------------------------------


def _python(code, **env):
    return subprocess.run([sys.executable, "-c", code], env=with_package(dict(os.environ, **env)),
                          capture_output=True, text=True, timeout=120)


def test_item5_uncaught_plan_error_exits_2(tmp_path):
    marker = tmp_path / "atexit-ran"
    run = _python("import atexit, rubick\n"
                  f"atexit.register(lambda: open({str(marker)!r}, 'w').close())\n"
                  "rubick.Plan.from_env()\n", RUBICK_DP="two")
    assert run.returncode == 2, run.stderr
    assert "RUBICK_DP='two'" in run.stderr and "Traceback" in run.stderr
    assert marker.exists(), "Python finalized as for sys.exit (atexit handlers ran)"
    # Inside Run, as a script would: the same.
    run = _python("import rubick\nwith rubick.Run() as run:\n    pass\n", RUBICK_STOP_SIGNAL="SIGKILL")
    assert run.returncode == 2 and "SIGKILL cannot be caught" in run.stderr, run.stderr
    # Other errors keep Python's exit 1.
    run = _python("import rubick\nraise RuntimeError('not a plan')\n")
    assert run.returncode == 1 and "not a plan" in run.stderr


def test_item5_per_field_variable_contradicting_rubick_plan_is_an_error():
    with pytest.raises(PlanError, match=r"RUBICK_GA=3 contradicts RUBICK_PLAN=dp2-tp1-pp1-mb4-ga2"):
        Plan.from_env({"RUBICK_PLAN": "dp2-tp1-pp1-mb4-ga2", "RUBICK_GA": "3"})
    # The launcher's complete form leaves ZeRO 0, no offload and no checkpointing out.
    for var, value in (("RUBICK_ZERO", "1"), ("RUBICK_GC", "1"), ("RUBICK_OFFLOAD", "optimizer")):
        with pytest.raises(PlanError, match=f"{var}={value} contradicts RUBICK_PLAN"):
            Plan.from_env({"RUBICK_PLAN": "dp2-tp1-pp1-mb4-ga2", var: value})
    # What the launcher writes (every variable, agreeing) is fine.
    env = {"RUBICK_PLAN": "dp2-tp1-pp1-mb4-ga2-z1-offopt-gc", "RUBICK_DP": "2", "RUBICK_TP": "1", "RUBICK_PP": "1",
           "RUBICK_ZERO": "1", "RUBICK_OFFLOAD": "optimizer", "RUBICK_GA": "2", "RUBICK_GC": "1",
           "RUBICK_MICRO_BATCH": "4", "RUBICK_GPUS": "2"}
    assert Plan.from_env(env).code() == "dp2-tp1-pp1-mb4-ga2-z1-offopt-gc"
    env = {"RUBICK_PLAN": "dp1-tp1-pp1-mb4-ga2", "RUBICK_ZERO": "0", "RUBICK_OFFLOAD": "none", "RUBICK_GC": "0"}
    assert Plan.from_env(env).code() == "dp1-tp1-pp1-mb4-ga2-z0"
    # The pytorch reference script refuses the same way (exit 2).
    need("torch")
    run = subprocess.run([sys.executable, os.path.join(REPO, "examples", "pytorch", "train.py"), "--iterations", "1"],
                         env=with_package(dict(os.environ, RUBICK_PLAN="dp1-tp1-pp1-mb16-ga1", RUBICK_GA="2")),
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "RUBICK_GA=2 contradicts RUBICK_PLAN" in run.stderr, run.stderr[-2000:]


def test_item5_rubick_hf_imports_transformers_only_when_needed(tmp_path):
    need("transformers")
    run = _python("import sys, rubick.hf\n"
                  "callback = rubick.hf.RubickCallback()\n"
                  "assert 'transformers' not in sys.modules, 'imported transformers'\n"
                  "assert 'torch' not in sys.modules, 'imported torch'\n"
                  "from transformers import TrainerCallback\n"
                  "for event in [m for m in dir(TrainerCallback) if m.startswith('on_')]:\n"
                  "    getattr(callback, event)\n"
                  "print('ok')\n")
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-3000:]


def test_item5_old_checkpoints_are_pruned_to_the_newest(tmp_path, monkeypatch):
    import rubick.hf as hf

    out = tmp_path / "out"

    def make(step, complete=True):
        path = out / f"checkpoint-{step}"
        path.mkdir(parents=True)
        (path / "weights.bin").write_bytes(b"x" * 100)
        if complete:
            (path / hf.COMPLETE).write_text(f"{step}\n")
        return str(path)

    for step in (10, 20):
        make(step)
    torn = make(25, complete=False)  # a save killed half-way
    newest = make(30)
    future_torn = make(40, complete=False)
    assert hf.last_checkpoint(str(out)) == newest
    removed = hf.prune_checkpoints(str(out), 1, written=newest)
    assert sorted(removed) == sorted([str(out / "checkpoint-10"), str(out / "checkpoint-20"), torn])
    assert sorted(os.listdir(out)) == ["checkpoint-30", "checkpoint-40"], "no leftovers of the prune"
    assert hf.last_checkpoint(str(out)) == newest and os.path.isdir(future_torn)
    # keep 2, and a protected one (the one resumed from) survives whatever keep says.
    resumed = make(5)
    make(50)
    hf.prune_checkpoints(str(out), 1, written=str(out / "checkpoint-50"), protected=[resumed])
    assert sorted(os.listdir(out)) == ["checkpoint-5", "checkpoint-50"]
    make(60)
    hf.prune_checkpoints(str(out), 2, written=str(out / "checkpoint-60"))
    assert sorted(os.listdir(out)) == ["checkpoint-50", "checkpoint-60"]
    # An interrupted prune (renamed, not yet deleted) is never resumed, and is cleaned next time.
    os.rename(out / "checkpoint-50", out / ".rubick-pruned-checkpoint-50.1")
    assert hf.last_checkpoint(str(out)) == str(out / "checkpoint-60")
    hf.prune_checkpoints(str(out), 1, written=str(out / "checkpoint-60"))
    assert os.listdir(out) == ["checkpoint-60"]
    # 0 keeps all; RUBICK_KEEP_CHECKPOINTS configures the callback; a bad value names it.
    make(70)
    assert hf.prune_checkpoints(str(out), 0, written=str(out / "checkpoint-70")) == []
    monkeypatch.setenv("RUBICK_KEEP_CHECKPOINTS", "3")
    assert hf.RubickCallback(plan=Plan.from_env({})).keep_checkpoints == 3
    assert hf.RubickCallback(plan=Plan.from_env({}), keep_checkpoints=0).keep_checkpoints == 0
    monkeypatch.setenv("RUBICK_KEEP_CHECKPOINTS", "-1")
    with pytest.raises(PlanError, match="RUBICK_KEEP_CHECKPOINTS"):
        hf.RubickCallback(plan=Plan.from_env({}))


# --- item 12 -------------------------------------------------------------------------


@pytest.mark.parametrize("env, message", [
    # The plan string and a per-field variable disagree.
    ({"RUBICK_PLAN": "dp2-tp1-pp1-mb4-ga2", "RUBICK_DP": "1"}, r"RUBICK_DP=1 contradicts RUBICK_PLAN=dp2-tp1-pp1"),
    # 4 processes on the 1 GPU the run was given.
    ({"RUBICK_DP": "4", "RUBICK_GPUS": "1"}, r"RUBICK_GPUS=1 but the plan needs dp\*tp\*pp = 4\*1\*1 = 4 .*RUBICK_DP"),
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
])
def test_item12_the_plan_refuses_contradictions_mismatches_bounds_and_uncatchable_signals(env, message):
    with pytest.raises(PlanError, match=message):
        Plan.from_env(env)


def test_item12_stop_signal_kill_is_a_plan_error_not_an_os_error():
    from rubick.plan import stop_signal

    with pytest.raises(PlanError, match="cannot be caught"):
        stop_signal({"RUBICK_STOP_SIGNAL": "SIGKILL"})
    assert stop_signal({"RUBICK_STOP_SIGNAL": "USR2"}) == signal.SIGUSR2
    # And a script given one exits 2 naming it, before anything else.
    run = _python("import rubick\nrubick.Run()\n", RUBICK_STOP_SIGNAL="SIGKILL")
    assert run.returncode == 2 and "RUBICK_STOP_SIGNAL" in run.stderr and "OSError" not in run.stderr


def test_item12_a_plan_that_agrees_with_its_gpus_still_runs():
    # The checks refuse only what is wrong: RUBICK_GPUS = dp*tp*pp is fine.
    p = Plan.from_env({"RUBICK_PLAN": "dp2-tp2-pp1-mb1-ga1", "RUBICK_GPUS": "4", "RUBICK_DP": "2"})
    assert (p.world_size, p.gpus) == (4, 4)
