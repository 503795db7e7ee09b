import signal

import pytest

from rubick import Plan, PlanError, parse_plan


def test_every_variable_of_the_launcher_is_read():
    env = {
        "RUBICK_DP": "2", "RUBICK_TP": "2", "RUBICK_PP": "1", "RUBICK_ZERO": "3", "RUBICK_OFFLOAD": "all",
        "RUBICK_GA": "4", "RUBICK_GC": "1", "RUBICK_MICRO_BATCH": "8", "RUBICK_GPUS": "4", "RUBICK_NODES": "2",
        "RUBICK_NODE_RANK": "1", "RUBICK_CPUS": "32", "RUBICK_JOB": "gpt", "RUBICK_METRICS": "/m.jsonl",
        "RUBICK_CHECKPOINT_DIR": "/ckpt", "RUBICK_DEEPSPEED_CONFIG": "/ds.json", "RUBICK_STOP_SIGNAL": "USR2",
    }
    p = Plan.from_env(env)
    assert (p.dp, p.tp, p.pp, p.zero, p.offload, p.ga, p.gc, p.micro_batch) == (2, 2, 1, 3, "all", 4, True, 8)
    assert (p.gpus, p.nodes, p.node_rank, p.cpus, p.job) == (4, 2, 1, 32, "gpt")
    assert (p.metrics, p.checkpoint_dir, p.deepspeed_config) == ("/m.jsonl", "/ckpt", "/ds.json")
    assert p.stop_signal == signal.SIGUSR2
    assert p.global_batch == 64 and p.world_size == 4
    assert p.code() == "dp2-tp2-pp1-mb8-ga4-z3-offall-gc" == p.name


def test_a_field_missing_from_its_variable_comes_from_the_plan_string():
    p = Plan.from_env({"RUBICK_PLAN": "dp2-tp1-pp1-mb4-ga2-z1-offopt-gc", "RUBICK_GA": "2"})
    assert (p.dp, p.micro_batch, p.ga, p.zero, p.offload, p.gc) == (2, 4, 2, 1, "optimizer", True)
    # A partial plan string names only what it names: the variables add the rest.
    p = Plan.from_env({"RUBICK_PLAN": "dp2-mb4", "RUBICK_GA": "3", "RUBICK_ZERO": "1"})
    assert (p.dp, p.micro_batch, p.ga, p.zero) == (2, 4, 3, 1)
    assert parse_plan("dp4-tp2-pp2-mb1-ga8-z0") == {"dp": 4, "tp": 2, "pp": 2, "micro_batch": 1, "ga": 8, "zero": 0}


def test_no_variable_is_a_single_process_run():
    p = Plan.from_env({})
    assert (p.world_size, p.global_batch, p.metrics, p.checkpoint_dir) == (1, 1, None, None)
    assert p.stop_signal == signal.SIGUSR1


@pytest.mark.parametrize("env, names", [
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
])
def test_a_bad_value_is_an_error_naming_its_variable(env, names):
    with pytest.raises(PlanError, match=names):
        Plan.from_env(env)


def test_the_world_must_match_the_plan():
    p = Plan.from_env({"RUBICK_DP": "2", "RUBICK_TP": "2"})
    p.check_world(4)
    with pytest.raises(PlanError, match="does not match the 2 process"):
        p.check_world(2)
