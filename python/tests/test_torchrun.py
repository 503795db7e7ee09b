"""python -m rubick.torchrun: a stop exits 0 once every worker did, and the contract's
exit codes pass through."""

import os
import signal
import subprocess
import sys
import time

from helpers import REPO, need, without


def test_a_stop_exits_0_once_every_worker_did(tmp_path):
    need("torch")
    # The example jobs launch through the package's launcher, torchrun's flags intact.
    for example in ("hf-trainer", "lightning", "torchrun-ddp"):
        with open(os.path.join(REPO, "examples", example, "job.yaml")) as f:
            text = f.read()
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
        env = dict(os.environ, READY=ready, OMP_NUM_THREADS="1", TORCH_ELASTIC_SHUTDOWN_TIMEOUT="3", **extra)
        proc = subprocess.Popen(
            [sys.executable, "-m", "rubick.torchrun", "--standalone", "--nproc-per-node=2", str(script)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
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


def test_the_contract_exit_codes_pass_the_contract_exit_codes_through(tmp_path):
    need("torch")
    script = tmp_path / "bad.py"
    script.write_text("import rubick\nrubick.install_exit_hook()\nrubick.Plan.from_env().check_world(2)\n")
    env = dict(os.environ, RUBICK_PLAN="dp4-tp1-pp1-mb1-ga1", OMP_NUM_THREADS="1")
    run = subprocess.run(
        [sys.executable, "-m", "rubick.torchrun", "--standalone", "--nproc-per-node=2", str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 2, run.stderr[-3000:]
    assert "the first worker to fail exited 2" in run.stderr


def test_a_stop_before_any_worker_started_is_a_clean_stop(tmp_path):
    """issue 40: "`python -m rubick.torchrun` stopped (by its stop signal, e.g. SIGUSR1)
    in its first ~3 s dies with exit 138 (128+SIGUSR1)"."""
    # A torch whose import takes as long as it likes (the real one takes seconds): the
    # launcher is stopped while it imports it.
    stub = tmp_path / "slow" / "torch"
    stub.mkdir(parents=True)
    ready = tmp_path / "importing-torch"
    (stub / "__init__.py").write_text(f"import time\nopen({str(ready)!r}, 'w').close()\ntime.sleep(60)\n")
    path = os.pathsep.join([str(stub.parent), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]])
    for name, sig in (("", signal.SIGUSR1), ("SIGTERM", signal.SIGTERM)):
        ready.unlink(missing_ok=True)
        env = dict(os.environ, PYTHONPATH=path, RUBICK_STOP_SIGNAL=name)
        proc = subprocess.Popen(
            [sys.executable, "-m", "rubick.torchrun", "--standalone", "--nproc-per-node=2", "train.py"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        start = time.time()
        while not ready.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.time() - start < 30, "the launcher did not start importing torch"
            time.sleep(0.02)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, (sig.name, proc.returncode, err[-3000:])
        assert f"stopped by {sig.name} before any worker started; exit 0" in err and "Traceback" not in err, err


def test_a_dp2_plan_on_2_cores_runs_1_thread_per_worker(tmp_path):
    """issue 42: "Following the README's contract snippet (`OMP_NUM_THREADS: "{cpus}"`),
    rubick made the job 2.9x slower": each of dp2's two workers ran 2 threads on 2 cores.
    The launcher gives each worker its share of the node's cores unless the user set
    OMP_NUM_THREADS (then theirs, with a warning where it oversubscribes the cores)."""
    need("torch")
    script = tmp_path / "threads.py"
    script.write_text("import os, torch\nprint('worker', os.environ['RANK'], torch.get_num_threads(), flush=True)\n")

    def threads(**env):
        run = subprocess.run(
            [sys.executable, "-m", "rubick.torchrun", "--standalone", "--nproc-per-node=2", str(script)],
            env=without("OMP_NUM_THREADS", "RUBICK_CPUS", "RUBICK_CPUS_PER_PROCESS", **env),
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert run.returncode == 0, run.stderr[-3000:]
        said = sorted(line.split()[1:] for line in run.stdout.splitlines() if line.startswith("worker "))
        assert [rank for rank, _ in said] == ["0", "1"], run.stdout
        return [int(n) for _, n in said], run.stderr

    assert threads(RUBICK_CPUS="2")[0] == [1, 1]  # 2 cores, 2 workers
    # As rubick launches a run of 4 cores (torchrun's own default: 1 each).
    assert threads(RUBICK_CPUS="4", RUBICK_CPUS_PER_PROCESS="2")[0] == [2, 2]
    # The user's OMP_NUM_THREADS wins, said to oversubscribe the node's 2 cores.
    counts, err = threads(RUBICK_CPUS="2", RUBICK_CPUS_PER_PROCESS="1", OMP_NUM_THREADS="2")
    assert counts == [2, 2] and "OMP_NUM_THREADS=2 for each of 2 workers: 4 threads on this node's 2 cores" in err, err
