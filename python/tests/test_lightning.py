"""rubick.integrations.lightning (examples/lightning): a Lightning Trainer under torchrun at DP 2 with
accumulation writes a metric line per optimizer step, stops on the signal after the
step in progress with an atomic checkpoint, and resumes at DP 1 at the next global
step, the loss continuing."""

import os
import subprocess
import sys

from helpers import contract_env, iterations, metric_lines, need, stopped_under_torchrun

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "examples", "lightning", "train.py")


def test_a_lightning_trainer_stops_on_the_signal_and_resumes_at_the_next_global_step(tmp_path):
    need("torch", "lightning")
    metrics, ckpt, env = contract_env(
        tmp_path, "dp2-tp1-pp1-mb8-ga2-z0", OMP_NUM_THREADS="1", RUBICK_TOTAL_ITERATIONS="100000"
    )
    lines, _ = stopped_under_torchrun([SCRIPT], env, metrics)
    stopped = lines[-1]["iter"]
    steps = iterations(metrics)
    assert [x["iter"] for x in steps] == list(range(1, stopped + 1)), "one line per optimizer step"
    assert all(x["samples"] == 32 for x in steps), "dp 2 x mb 8 x ga 2"
    assert all(x["forward_s"] > 0 and x["backward_sync_s"] > 0 and "optimizer_s" in x for x in steps)
    assert os.listdir(ckpt) == ["last.ckpt"], "no temporary file left"
    # Resumed by one process at DP 1, accumulation 4 (the same global batch).
    env.update(RUBICK_PLAN="dp1-tp1-pp1-mb8-ga4-z0", RUBICK_TOTAL_ITERATIONS=str(stopped + 3))
    run = subprocess.run([sys.executable, SCRIPT], env=env, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    after = iterations(metrics)[len(steps) :]
    assert [x["iter"] for x in after] == [stopped + 1, stopped + 2, stopped + 3]
    first, last = steps[0]["loss"], steps[-1]["loss"]
    assert last < first, "it learned before the stop"
    assert abs(after[0]["loss"] - last) < abs(after[0]["loss"] - first), (first, last, after[0]["loss"])
    assert metric_lines(metrics)[-1] == {"rubick": 1, "event": "checkpointed", "iter": stopped + 3}
    # Tensor parallelism has no Trainer switch: exit 2, saying so.
    env.update(RUBICK_PLAN="dp1-tp2-pp1-mb8-ga1-z0")
    run = subprocess.run([sys.executable, SCRIPT], env=env, capture_output=True, text=True, timeout=180)
    assert run.returncode == 2 and "tensor or pipeline" in run.stderr, run.stderr[-2000:]
