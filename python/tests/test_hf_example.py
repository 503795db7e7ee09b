"""examples/hf-trainer: a Hugging Face Trainer (GPT-2 configuration built locally) under
torchrun at DP 2, adopting the contract with `rubick.integrations.hf`: metric lines per optimizer
step, a stop by signal that saves a complete Trainer checkpoint after the step in
progress, and a resume at DP 1 by the Trainer at the next global step, the loss
continuing where it was."""

import os
import subprocess
import sys

from helpers import contract_env, iterations, metric_lines, need, stopped_under_torchrun

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "examples", "hf-trainer", "train.py")


def test_a_trainer_stops_on_the_signal_and_resumes_at_the_next_global_step(tmp_path):
    need("torch", "transformers", "accelerate")
    metrics, ckpt, env = contract_env(tmp_path, "dp2-tp1-pp1-mb4-ga1-z0", OMP_NUM_THREADS="1")
    lines, _ = stopped_under_torchrun([SCRIPT, "--max-steps", "100000"], env, metrics)
    stopped = lines[-1]["iter"]
    steps = iterations(metrics)
    assert [x["iter"] for x in steps] == list(range(1, stopped + 1))
    assert all(x["samples"] == 8 and "loss" in x for x in steps), steps[:2]
    assert os.path.exists(os.path.join(ckpt, f"checkpoint-{stopped}", "rubick-complete"))
    # Resumed by one process at DP 1 with accumulation 2 (the same global batch).
    env.update(RUBICK_PLAN="dp1-tp1-pp1-mb4-ga2-z0")
    run = subprocess.run(
        [sys.executable, SCRIPT, "--max-steps", str(stopped + 3)], env=env, capture_output=True, text=True, timeout=180
    )
    assert run.returncode == 0, run.stderr[-3000:]
    after = iterations(metrics)[len(steps) :]
    assert [x["iter"] for x in after] == [stopped + 1, stopped + 2, stopped + 3]
    first, last = steps[0]["loss"], steps[-1]["loss"]
    assert last < first, "it learned before the stop"
    assert abs(after[0]["loss"] - last) < abs(after[0]["loss"] - first), (first, last, after[0]["loss"])
    assert metric_lines(metrics)[-1] == {"rubick": 1, "event": "checkpointed", "iter": stopped + 3}
    # The checkpoint of the stop was pruned once the next was complete.
    assert sorted(os.listdir(ckpt)) == [f"checkpoint-{stopped + 3}"], os.listdir(ckpt)
    # Tensor parallelism has no Trainer switch: exit 2, saying so.
    env.update(RUBICK_PLAN="dp1-tp2-pp1-mb4-ga1-z0")
    run = subprocess.run(
        [sys.executable, SCRIPT, "--max-steps", "1"], env=env, capture_output=True, text=True, timeout=180
    )
    assert run.returncode == 2 and "tensor or pipeline" in run.stderr, run.stderr[-2000:]
