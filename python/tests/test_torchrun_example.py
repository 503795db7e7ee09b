"""examples/torchrun-ddp: a plain DDP loop under torchrun, adopting the contract with
this package, stops cleanly on the stop signal (every worker checkpoints after the same
step and exits; none is left) and resumes at another data parallelism."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "examples", "torchrun-ddp", "train.py")


def need_torch():
    try:
        import torch  # noqa: F401
    except ImportError:
        if os.environ.get("RUBICK_REQUIRE_PYTORCH") == "1":
            pytest.fail("RUBICK_REQUIRE_PYTORCH=1 but torch does not import")
        pytest.skip("no torch in this Python (scripts/python-env.sh installs it)")


def metric_lines(path):
    if not os.path.exists(path):
        return []
    return [json.loads(line) for line in open(path).read().splitlines()]


def workers():
    out = subprocess.run(["pgrep", "-f", SCRIPT], capture_output=True, text=True).stdout.split()
    return [p for p in out if int(p) != os.getpid()]


def test_torchrun_ddp_stops_on_the_signal_and_resumes_at_another_plan(tmp_path):
    need_torch()
    metrics, ckpt = str(tmp_path / "m.jsonl"), str(tmp_path / "ckpt")
    env = dict(os.environ, RUBICK_PLAN="dp2-tp1-pp1-mb8-ga2-z0", RUBICK_METRICS=metrics,
               RUBICK_CHECKPOINT_DIR=ckpt, RUBICK_CPUS="2")
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                "--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1", SCRIPT, "--iterations", "100000"]
    proc = subprocess.Popen(launcher, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    start = time.time()
    while len([x for x in metric_lines(metrics) if "iter_time_s" in x]) < 3:
        assert proc.poll() is None, proc.communicate()
        assert time.time() - start < 120, "no metric lines in 120 s"
        time.sleep(0.1)
    proc.send_signal(signal.SIGUSR1)  # torchrun forwards it to its workers
    _, err = proc.communicate(timeout=60)
    lines = metric_lines(metrics)
    assert lines[-1].get("event") == "checkpointed", (lines[-3:], err[-3000:])
    stopped = lines[-1]["iter"]
    iters = [x["iter"] for x in lines if "iter_time_s" in x]
    assert iters == list(range(1, stopped + 1)), iters
    assert all(x["samples"] == 32 for x in lines if "iter_time_s" in x), "dp 2 x mb 8 x ga 2"
    assert not workers(), "a worker outlived the stop"
    # Resumed by one process at dp 1, ga 4: numbering continues.
    env.update(RUBICK_PLAN="dp1-tp1-pp1-mb8-ga4-z0")
    run = subprocess.run([sys.executable, SCRIPT, "--iterations", str(stopped + 3)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    after = [x for x in metric_lines(metrics) if "iter_time_s" in x][len(iters):]
    assert [x["iter"] for x in after] == [stopped + 1, stopped + 2, stopped + 3]
    assert metric_lines(metrics)[-1] == {"rubick": 1, "event": "checkpointed", "iter": stopped + 3}
    # A plan the script cannot run (tensor parallelism) exits 2 naming why.
    env.update(RUBICK_PLAN="dp1-tp2-pp1-mb8-ga1-z0")
    run = subprocess.run([sys.executable, SCRIPT, "--iterations", "1"], env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 2 and "does not match" in run.stderr, run.stderr
