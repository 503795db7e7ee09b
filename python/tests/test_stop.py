"""issue 44, a stop that never aborts a rank: the stop vote's tensor is let go by
gloo's thread before a rank may leave, a stop that comes once the run is over is
ignored (not fatal), and rubick.torchrun relays a stop to a worker only once the worker
catches it."""

import os
import signal
import subprocess
import sys
import threading
import time

from helpers import need, run_processes


def test_the_vote_waits_until_only_its_caller_holds_its_tensor():
    need("torch")
    import torch

    from rubick.stop import released

    # A reference held in C++ (a view's base), as gloo's worker thread holds the work
    # of a collective that already completed, let go of 0.2 s later.
    tensor = torch.tensor([1.0])
    holder = [tensor.view(1)]
    assert tensor._use_count() > 1
    threading.Timer(0.2, holder.clear).start()
    start = time.monotonic()
    released(tensor)
    assert time.monotonic() - start >= 0.15 and tensor._use_count() == 1
    # Held for good (a profiler, say): bounded.
    kept = tensor.view(1)
    start = time.monotonic()
    released(tensor, timeout=0.1)
    assert 0.1 <= time.monotonic() - start < 2 and kept._base is tensor


def test_a_stop_once_the_run_is_over_is_ignored_not_fatal(tmp_path):
    # A worker that ended cleanly, and a stop that keeps coming through the
    # interpreter's exit (rubick signals every process of a run, torchrun relays it
    # too): it died of it (-10, "local rank 0: -10") once Python's exit had restored the
    # signal's default action. Also where a framework's handler replaced the flag's
    # (issue 42: the flag's only was ignored at exit).
    script = tmp_path / "late.py"
    script.write_text(
        "import os, signal, subprocess\n"
        "import rubick\n"
        "flag = rubick.StopFlag(signal.SIGUSR1, signal.SIGTERM)\n"
        "if os.environ.get('OVER'):  # a framework's handler installed over the flag's\n"
        "    signal.signal(signal.SIGUSR1, lambda *_: None)\n"
        "loop = f'while kill -USR1 {os.getpid()} 2>/dev/null; do :; done'\n"
        "subprocess.Popen(['sh', '-c', loop], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "print('ended', flush=True)\n"
    )
    for over in ("", "", "", "1", "1"):
        env = dict(os.environ, OVER=over)
        run = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
        assert (run.returncode, run.stdout) == (0, "ended\n"), (over, run.returncode, run.stderr[-2000:])
    # A flag uninstalled leaves the signal to whatever handled it before.
    check = subprocess.run(
        [
            sys.executable,
            "-c",
            "import atexit, signal, rubick\n"
            "atexit.register(lambda: print(signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL))\n"
            "rubick.StopFlag(signal.SIGUSR1).uninstall()\n",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.stdout.strip() == "True", check


def _children(pid):
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            out += f.read().split()
    return out


def test_the_launcher_relays_a_stop_only_once_the_worker_catches_it(tmp_path):
    need("torch")
    # Workers that take 3 s to catch the stop (Python's start, slow imports): stopped
    # before that, they died of it (-10) without a checkpoint.
    script = tmp_path / "train.py"
    script.write_text(
        "import os, signal, time\n"
        "time.sleep(3)\n"
        "import rubick\n"
        "flag = rubick.StopFlag(signal.SIGUSR1, signal.SIGTERM)\n"
        "while not flag.requested:\n"
        "    time.sleep(0.05)\n"
        "print('worker', os.environ['RANK'], 'stopped cleanly', flush=True)\n"
    )
    env = dict(os.environ, OMP_NUM_THREADS="1", RUBICK_METRICS=str(tmp_path / "m.jsonl"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "rubick.torchrun", "--standalone", "--nproc-per-node=2", str(script)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    start = time.time()
    while len(_children(proc.pid)) < 2:
        assert proc.poll() is None, proc.communicate()
        assert time.time() - start < 120, "the workers did not start"
        time.sleep(0.01)
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert out.count("stopped cleanly") == 2 and "Traceback" not in err, (out, err[-3000:])
    assert not run_processes(env["RUBICK_METRICS"]), "a worker outlived the stop"
