"""The contract end to end, in real processes: metric lines, a stop by signal with an
atomic checkpoint, a resume at another plan, OOM, a second signal during the save."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from rubick import Reporter, checkpoint

# A plain loop: a counter as the model, `sleep` as the work.
SCRIPT = r"""
import sys, time
import rubick

with rubick.Run() as run:
    saved = run.resume()
    weights = saved["w"] if saved is not None else 0
    state = lambda: {"w": weights}
    for it in run.iterations(total=int(sys.argv[1]), state=state):
        with it.phase("forward"):
            time.sleep(float(sys.argv[2]))
        with it.phase("optimizer"):
            weights += run.plan.dp
            if sys.argv[3] == "oom" and it.number == 2:
                raise MemoryError("cannot allocate 1 TiB")
        it.loss = 1.0 / it.number
    print("done", weights, flush=True)
"""


def start(tmp_path, total, sleep, mode="", **env):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    full = dict(
        os.environ, RUBICK_METRICS=str(tmp_path / "metrics.jsonl"), RUBICK_CHECKPOINT_DIR=str(tmp_path / "ckpt"), **env
    )
    return subprocess.Popen(
        [sys.executable, str(script), str(total), str(sleep), mode],
        env=full,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def wait_for_iterations(tmp_path, n, proc, timeout=30):
    start = time.time()
    while len([x for x in lines(tmp_path) if "iter_time_s" in x]) < n:
        assert proc.poll() is None, proc.communicate()
        assert time.time() - start < timeout, lines(tmp_path)
        time.sleep(0.02)


def test_a_run_writes_one_line_per_iteration_and_checkpoints_at_its_end(tmp_path):
    proc = start(tmp_path, 4, 0.01, RUBICK_DP="2", RUBICK_MICRO_BATCH="8")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.strip() == "done 8"
    its = [x for x in lines(tmp_path) if "iter" in x and "event" not in x]
    assert [x["iter"] for x in its] == [1, 2, 3, 4]
    for x in its:
        assert x["rubick"] == 1 and x["samples"] == 16
        assert x["iter_time_s"] >= x["forward_s"] >= 0.01
        assert "optimizer_s" in x and x["peak_memory_gib"] > 0
    assert lines(tmp_path)[-1] == {"rubick": 1, "event": "checkpointed", "iter": 4}
    assert checkpoint.load(str(tmp_path / "ckpt"))[:2] == (4, {"w": 8})


def test_the_stop_signal_checkpoints_after_the_step_and_a_resume_continues_at_another_plan(tmp_path):
    proc = start(tmp_path, 1000, 0.05, RUBICK_DP="2", RUBICK_STOP_SIGNAL="SIGUSR2")
    wait_for_iterations(tmp_path, 3, proc)
    proc.send_signal(signal.SIGUSR2)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    last = lines(tmp_path)[-1]
    assert last["event"] == "checkpointed"
    stopped = last["iter"]
    iters = [x["iter"] for x in lines(tmp_path) if "iter_time_s" in x]
    assert iters == list(range(1, stopped + 1)), "the step in progress finished, no later one started"
    at, state, plan = checkpoint.load(str(tmp_path / "ckpt"))
    assert (at, state) == (stopped, {"w": 2 * stopped}) and plan.startswith("dp2-")
    # Resumed at dp 4: numbering and state continue.
    proc = start(tmp_path, stopped + 2, 0.01, RUBICK_DP="4")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.strip() == f"done {2 * stopped + 8}"
    assert [x["iter"] for x in lines(tmp_path) if "iter_time_s" in x][-2:] == [stopped + 1, stopped + 2]
    assert "resuming after iteration" in err


def test_out_of_memory_is_the_oom_event_and_exit_3(tmp_path):
    proc = start(tmp_path, 10, 0.01, "oom")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, err
    assert lines(tmp_path)[-1] == {"rubick": 1, "event": "oom"}
    assert "out of memory" in err


def test_signals_during_a_save_do_not_tear_it(tmp_path):
    # A slow save (a big state written in many chunks) signalled again and again: the
    # checkpoint is whole, and the previous one stays until the rename.
    directory = tmp_path / "ckpt"
    checkpoint.save(str(directory), 1, {"w": "old"})
    flag = __import__("rubick").StopFlag(signal.SIGUSR1)
    try:

        def slow(f):
            for _ in range(50):
                os.kill(os.getpid(), signal.SIGUSR1)
                f.write(b"x" * 1000)
                assert checkpoint.load(str(directory))[1] == {"w": "old"}
            raise RuntimeError("killed mid-save")

        with pytest.raises(RuntimeError), flag.held():
            checkpoint.write_atomic(str(directory / checkpoint.FILE), slow)
        assert checkpoint.load(str(directory))[1] == {"w": "old"}, "a failed save leaves the previous one"
        assert [p.name for p in directory.iterdir()] == [checkpoint.FILE], "no temporary file left"
        assert flag.requested, "the held signals were delivered after the save"
    finally:
        flag.uninstall()


def test_only_rank_0_writes_metric_lines(tmp_path, monkeypatch):
    path = tmp_path / "m.jsonl"
    monkeypatch.setenv("RANK", "1")
    with Reporter(metrics=str(path)).iteration(samples=4):
        pass
    assert not path.exists()
    monkeypatch.setenv("RANK", "0")
    with Reporter(metrics=str(path), first_iteration=7).iteration(samples=4, loss=0.5):
        pass
    line = json.loads(path.read_text())
    assert (line["iter"], line["samples"], line["loss"]) == (7, 4, 0.5)


def test_a_signal_during_the_agreement_is_not_lost(monkeypatch):
    # A stub torch.distributed whose all-reduce is where the signal lands: this step's
    # vote was already taken (no stop), the flag must survive to vote at the next step.
    # (It was overwritten with the all-reduce's 0: the stop signal was lost, and
    # torchrun killed the workers 30 s later without a checkpoint.)
    import types

    flag = __import__("rubick").StopFlag(signal.SIGUSR1)

    class Tensor:
        def __init__(self, values, device=None):
            self.values = list(values)

        def item(self):
            return self.values[0]

    def all_reduce(t, op=None):
        flag._handle(signal.SIGUSR1, None)  # the signal arrives mid-collective

    dist = types.SimpleNamespace(
        is_available=lambda: True,
        is_initialized=lambda: True,
        get_backend=lambda: "gloo",
        all_reduce=all_reduce,
        ReduceOp=types.SimpleNamespace(MAX="max"),
    )
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(distributed=dist, tensor=Tensor))
    try:
        assert flag.agreed() is False, "every rank voted 0 at this step"
        assert flag.requested, "the signal is kept"
        assert flag.agreed() is True, "and stops every rank at the next step"
    finally:
        flag.uninstall()
