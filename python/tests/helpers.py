"""What the tests of the adapters and examples share: the modules they need, metric
lines, a Python subprocess, and a training script under torchrun at DP 2 stopped by the
signal. The subprocesses import the installed package, as the tests do."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest


def free_port():
    """A TCP port free on this machine now: a fixed one collides with the same test of
    another checkout running beside this one."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def need(*modules):
    """Skips (or, under RUBICK_REQUIRE_PYTORCH=1, fails) unless every module imports."""
    for name in modules:
        try:
            __import__(name)
        except ImportError as e:
            if os.environ.get("RUBICK_REQUIRE_PYTORCH") == "1":
                pytest.fail(f"RUBICK_REQUIRE_PYTORCH=1 but {e}")
            pytest.skip(f"{e} (scripts/python-env.sh installs it)")


def metric_lines(path):
    """The JSON lines of a metrics file (none when it does not exist yet)."""
    if not os.path.exists(path):
        return []
    return [json.loads(line) for line in open(path).read().splitlines()]


def iterations(path):
    """The iteration lines (not the events) of a metrics file."""
    return [x for x in metric_lines(path) if "iter_time_s" in x]


def workers(script):
    """Live processes whose command line names `script` (this test's own excepted)."""
    out = subprocess.run(["pgrep", "-f", script], capture_output=True, text=True).stdout.split()
    return [p for p in out if int(p) != os.getpid()]


def run_processes(metrics):
    """Live processes of the run whose metrics file is `metrics`, by their environment
    (as rubick marks a run's processes): those a stop must leave none of, whatever runs
    beside it (another run of the same script, from another test)."""
    mark = f"RUBICK_METRICS={metrics}".encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                marked = mark in f.read().split(b"\0")
        except OSError:  # gone, or not ours to read
            continue
        if marked and int(pid) != os.getpid():
            found.append(pid)
    return found


#: The checkout's root (the examples are under it).
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def without(*names, **env):
    """This environment without the variables ``names``, then ``env`` added."""
    return dict({k: v for k, v in os.environ.items() if k not in names}, **env)


def run_python(code, unset=(), **env):
    """``python -c code`` with ``env`` added to this environment and the variables in
    ``unset`` left out: its exit status and output."""
    return subprocess.run(
        [sys.executable, "-c", code], env=without(*unset, **env), capture_output=True, text=True, timeout=120
    )


def contract_env(tmp_path, plan, **extra):
    """A run's contract in this environment: its metrics file and checkpoint directory
    under `tmp_path`, `plan`, and `extra` variables; returns (metrics, checkpoints, env)."""
    metrics, ckpt = str(tmp_path / "m.jsonl"), str(tmp_path / "ckpt")
    env = dict(os.environ, RUBICK_PLAN=plan, RUBICK_METRICS=metrics, RUBICK_CHECKPOINT_DIR=ckpt, **extra)
    return metrics, ckpt, env


def stopped_under_torchrun(script_and_args, env, metrics, after=8, timeout=180):
    """Runs the script under torchrun (``python -m rubick.torchrun``, as the example jobs
    launch it) with 2 workers until `after` iteration lines, sends torchrun the stop
    signal (it relays it), and returns (the metric lines, stderr) once it exited; the
    last line must be the `checkpointed` event, and the launcher's exit code 0."""
    launcher = [sys.executable, "-m", "rubick.torchrun", "--standalone", "--nproc-per-node", "2", *script_and_args]
    proc = subprocess.Popen(launcher, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    start = time.time()
    while len(iterations(metrics)) < after:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.time() - start < timeout, f"no {after} metric lines in {timeout} s"
        time.sleep(0.1)
    proc.send_signal(signal.SIGUSR1)
    _, err = proc.communicate(timeout=120)
    lines = metric_lines(metrics)
    assert lines[-1].get("event") == "checkpointed", (lines[-3:], err[-3000:])
    assert proc.returncode == 0 and "SignalException" not in err, (proc.returncode, err[-3000:])
    return lines, err
