"""examples/hf-trainer: a Hugging Face Trainer (GPT-2 configuration built locally) under
torchrun at DP 2, adopting the contract with `rubick.hf`: metric lines per optimizer
step, a stop by signal that saves a complete Trainer checkpoint after the step in
progress, and a resume at DP 1 by the Trainer at the next global step, the loss
continuing where it was."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "examples", "hf-trainer", "train.py")


def need_transformers():
    try:
        import accelerate  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        if os.environ.get("RUBICK_REQUIRE_PYTORCH") == "1":
            pytest.fail(f"RUBICK_REQUIRE_PYTORCH=1 but {e}")
        pytest.skip(f"{e} (scripts/python-env.sh installs torch, transformers and accelerate)")


def metric_lines(path):
    if not os.path.exists(path):
        return []
    return [json.loads(line) for line in open(path).read().splitlines()]


def test_a_trainer_stops_on_the_signal_and_resumes_at_the_next_global_step(tmp_path):
    need_transformers()
    metrics, ckpt = str(tmp_path / "m.jsonl"), str(tmp_path / "ckpt")
    env = dict(os.environ, RUBICK_PLAN="dp2-tp1-pp1-mb4-ga1-z0", RUBICK_METRICS=metrics,
               RUBICK_CHECKPOINT_DIR=ckpt, OMP_NUM_THREADS="1")
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                "--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1", SCRIPT, "--max-steps", "100000"]
    proc = subprocess.Popen(launcher, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    start = time.time()
    while len([x for x in metric_lines(metrics) if "iter_time_s" in x]) < 8:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.time() - start < 180, "no 8 metric lines in 180 s"
        time.sleep(0.1)
    proc.send_signal(signal.SIGUSR1)
    _, err = proc.communicate(timeout=120)
    lines = metric_lines(metrics)
    assert lines[-1].get("event") == "checkpointed", (lines[-3:], err[-3000:])
    stopped = lines[-1]["iter"]
    steps = [x for x in lines if "iter_time_s" in x]
    assert [x["iter"] for x in steps] == list(range(1, stopped + 1))
    assert all(x["samples"] == 8 and "loss" in x for x in steps), steps[:2]
    assert os.path.exists(os.path.join(ckpt, f"checkpoint-{stopped}", "rubick-complete"))
    # Resumed by one process at DP 1 with accumulation 2 (the same global batch).
    env.update(RUBICK_PLAN="dp1-tp1-pp1-mb4-ga2-z0")
    run = subprocess.run([sys.executable, SCRIPT, "--max-steps", str(stopped + 3)], env=env,
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    after = [x for x in metric_lines(metrics) if "iter_time_s" in x][len(steps):]
    assert [x["iter"] for x in after] == [stopped + 1, stopped + 2, stopped + 3]
    first, last = steps[0]["loss"], steps[-1]["loss"]
    assert last < first, "it learned before the stop"
    assert abs(after[0]["loss"] - last) < abs(after[0]["loss"] - first), (first, last, after[0]["loss"])
    assert metric_lines(metrics)[-1] == {"rubick": 1, "event": "checkpointed", "iter": stopped + 3}
    # Tensor parallelism has no Trainer switch: exit 2, saying so.
    env.update(RUBICK_PLAN="dp1-tp2-pp1-mb4-ga1-z0")
    run = subprocess.run([sys.executable, SCRIPT, "--max-steps", "1"], env=env, capture_output=True, text=True,
                         timeout=180)
    assert run.returncode == 2 and "tensor or pipeline" in run.stderr, run.stderr[-2000:]
