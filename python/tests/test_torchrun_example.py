"""examples/torchrun-ddp: a plain DDP loop under torchrun, adopting the contract with
this package, stops cleanly on the stop signal (every worker checkpoints after the same
step and exits; none is left) and resumes at another data parallelism."""

import os
import subprocess
import sys

from helpers import contract_env, iterations, metric_lines, need, stopped_under_torchrun, workers

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "examples", "torchrun-ddp", "train.py")


def test_torchrun_ddp_stops_on_the_signal_and_resumes_at_another_plan(tmp_path):
    need("torch")
    metrics, _, env = contract_env(tmp_path, "dp2-tp1-pp1-mb8-ga2-z0", RUBICK_CPUS="2")
    lines, _ = stopped_under_torchrun([SCRIPT, "--iterations", "100000"], env, metrics, after=3)
    stopped = lines[-1]["iter"]
    steps = iterations(metrics)
    assert [x["iter"] for x in steps] == list(range(1, stopped + 1))
    assert all(x["samples"] == 32 for x in steps), "dp 2 x mb 8 x ga 2"
    assert not workers(SCRIPT), "a worker outlived the stop"
    # Resumed by one process at dp 1, ga 4: numbering continues.
    env.update(RUBICK_PLAN="dp1-tp1-pp1-mb8-ga4-z0")
    run = subprocess.run(
        [sys.executable, SCRIPT, "--iterations", str(stopped + 3)], env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert [x["iter"] for x in iterations(metrics)[len(steps) :]] == [stopped + 1, stopped + 2, stopped + 3]
    assert metric_lines(metrics)[-1] == {"rubick": 1, "event": "checkpointed", "iter": stopped + 3}
    # A plan the script cannot run (tensor parallelism) exits 2 naming why.
    env.update(RUBICK_PLAN="dp1-tp2-pp1-mb8-ga1-z0")
    run = subprocess.run(
        [sys.executable, SCRIPT, "--iterations", "1"], env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 2 and "does not match" in run.stderr, run.stderr
