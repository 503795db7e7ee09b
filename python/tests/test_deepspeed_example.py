"""examples/deepspeed: a DeepSpeed engine loop under DeepSpeed's own launcher, adopting
the contract with this package, trains at the plan's ZeRO stage from the JSON rubick
writes, stops cleanly on the stop signal (every worker checkpoints after the same step
and exits; none is left) and resumes at another data parallelism and ZeRO stage."""

import json
import os
import signal
import subprocess
import sys
import time

from helpers import free_port, iterations, metric_lines, need, workers

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "examples", "deepspeed", "train.py")


def deepspeed_json(path, dp, micro_batch, ga, zero):
    """What rubick writes for the plan (rubick_core::launch::deepspeed_config)."""
    config = {
        "train_batch_size": dp * micro_batch * ga,
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": ga,
        "zero_optimization": {"stage": zero},
        "bf16": {"enabled": True},
        "steps_per_print": 1_000_000,
    }
    with open(path, "w") as f:
        json.dump(config, f)
    return path


def test_a_deepspeed_engine_stops_on_the_signal_and_resumes_at_another_plan(tmp_path):
    need("torch", "deepspeed")
    metrics, ckpt = str(tmp_path / "m.jsonl"), str(tmp_path / "ckpt")
    launcher = os.path.join(os.path.dirname(sys.executable), "deepspeed")
    env = dict(
        os.environ,
        RUBICK_PLAN="dp2-tp1-pp1-mb4-ga2-z2",
        RUBICK_METRICS=metrics,
        RUBICK_CHECKPOINT_DIR=ckpt,
        RUBICK_CPUS="2",
        OMP_NUM_THREADS="1",
        RUBICK_DEEPSPEED_CONFIG=deepspeed_json(str(tmp_path / "z2.json"), 2, 4, 2, 2),
        PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
    )
    # The launcher in a session of its own, as rubick starts a run: the signal reaches
    # the group (the launcher dies of it; its workers catch it and checkpoint).
    proc = subprocess.Popen(
        [launcher, "--num_gpus=2", f"--master_port={free_port()}", SCRIPT, "--iterations", "100000"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    start = time.time()
    while len(iterations(metrics)) < 10:
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        assert time.time() - start < 240, "no 10 metric lines in 240 s"
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGUSR1)
    out, _ = proc.communicate(timeout=120)
    deadline = time.time() + 60
    while workers(SCRIPT) and time.time() < deadline:
        time.sleep(0.2)
    assert not workers(SCRIPT), "a worker outlived the stop"
    lines = metric_lines(metrics)
    assert lines[-1].get("event") == "checkpointed", (lines[-3:], out[-3000:])
    stopped = lines[-1]["iter"]
    steps = iterations(metrics)
    assert [x["iter"] for x in steps] == list(range(1, stopped + 1))
    assert all(x["samples"] == 16 for x in steps), "dp 2 x mb 4 x ga 2"
    # Resumed by one process at dp 1, ZeRO 0, ga 4: numbering and the loss continue.
    env.update(
        RUBICK_PLAN="dp1-tp1-pp1-mb4-ga4-z0",
        RUBICK_DEEPSPEED_CONFIG=deepspeed_json(str(tmp_path / "z0.json"), 1, 4, 4, 0),
    )
    run = subprocess.run(
        [launcher, "--num_gpus=1", f"--master_port={free_port()}", SCRIPT, "--iterations", str(stopped + 3)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    resumed = iterations(metrics)[len(steps) :]
    assert [x["iter"] for x in resumed] == [stopped + 1, stopped + 2, stopped + 3]
    assert resumed[0]["loss"] < 0.5 * steps[0]["loss"], "the loss continues, not from the start"
    assert metric_lines(metrics)[-1] == {"rubick": 1, "event": "checkpointed", "iter": stopped + 3}
