"""The reference workload's (examples/pytorch/train.py) sharded checkpoints: a run
reconfigured dp2 -> tp2 (with sequence parallelism) -> pp2 -> dp1-z2 -> dp2-z1 -> dp1,
each run resumed at the next iteration from the DCP shards its predecessor wrote under
another layout, follows the loss curve of one uninterrupted run; one step of the chain
saves the full (gathered) checkpoint instead, and the next resumes from that. And the
package's sharded save commits atomically: a save that dies leaves the previous one."""

import json
import os
import subprocess
import sys

import pytest
from helpers import REPO, iterations, metric_lines, need

SCRIPT = os.path.join(REPO, "examples", "pytorch", "train.py")

#: (plan, processes, checkpoint format it saves in)
CHAIN = [
    ("dp2-tp1-pp1-mb8-ga1", 2, "sharded"),
    ("dp1-tp2-pp1-mb4-ga4-sp", 2, "sharded"),
    ("dp1-tp1-pp2-mb4-ga4", 2, "full"),
    ("dp1-tp1-pp1-mb8-ga2-z2", 1, "sharded"),
    ("dp2-tp1-pp1-mb4-ga2-z1", 2, "sharded"),
    ("dp1-tp1-pp1-mb16-ga1", 1, "sharded"),
]
STEPS = 2  # iterations per run


def train(plan, procs, iterations_, metrics, ckpt=None, fmt="sharded"):
    args = [
        sys.executable,
        SCRIPT,
        "--iterations",
        str(iterations_),
        "--metrics",
        metrics,
        "--cpus",
        "2",
        "--checkpoint-format",
        fmt,
    ]
    if procs > 1:
        args += ["--nproc-per-node", str(procs)]
    if ckpt:
        args += ["--checkpoint-dir", ckpt]
    env = dict(os.environ, RUBICK_PLAN=plan)
    for key in ("RUBICK_CHECKPOINT_DIR", "RUBICK_METRICS", "RUBICK_ITERATIONS", "RUBICK_CHECKPOINT_FORMAT"):
        env.pop(key, None)
    run = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"{plan}: exit {run.returncode}\n{run.stderr[-4000:]}"
    return run.stderr


def test_a_run_reconfigured_through_dp_tp_pp_and_zero_resumes_from_shards_on_the_same_loss_curve(tmp_path):
    need("torch")
    reference = str(tmp_path / "reference.jsonl")
    train("dp1-tp1-pp1-mb16-ga1", 1, STEPS * len(CHAIN), reference)
    expected = {x["iter"]: x["loss"] for x in iterations(reference)}

    metrics, ckpt = str(tmp_path / "m.jsonl"), str(tmp_path / "ckpt")
    for n, (plan, procs, fmt) in enumerate(CHAIN):
        err = train(plan, procs, STEPS, metrics, ckpt, fmt)
        if n > 0:
            previous = CHAIN[n - 1][2]
            assert f"({previous}, loaded in" in err and f"iteration {n * STEPS} saved at plan" in err, err[-3000:]
        # The numbering continues, and the event says how the save went.
        steps = iterations(metrics)
        assert [x["iter"] for x in steps] == list(range(1, (n + 1) * STEPS + 1)), (plan, steps)
        event = metric_lines(metrics)[-1]
        assert event["event"] == "checkpointed" and event["iter"] == (n + 1) * STEPS, event
        assert event["format"] == fmt and event["save_s"] > 0, event
        # One checkpoint in the directory: the one just written.
        entries = sorted(os.listdir(ckpt))
        if fmt == "sharded":
            assert len(entries) == 2 and entries[1] == "sharded.json", entries
            with open(os.path.join(ckpt, "sharded.json")) as f:
                record = json.load(f)
            assert record["path"] == entries[0] and record["iteration"] == (n + 1) * STEPS, record
            shards = [e for e in os.listdir(os.path.join(ckpt, entries[0])) if e.endswith(".distcp")]
            assert 1 <= len(shards) <= procs, shards
        else:
            assert entries == ["checkpoint.pt"], entries

    got = {x["iter"]: x["loss"] for x in iterations(metrics)}
    assert sorted(got) == sorted(expected)
    for it in sorted(expected):
        assert got[it] == pytest.approx(expected[it], abs=2e-4), (
            f"iteration {it}: {got[it]} after the reconfigurations, {expected[it]} uninterrupted\n{got}\n{expected}"
        )
    # Training moved: the curve is not flat, so matching it means the state was carried.
    assert expected[1] - expected[STEPS * len(CHAIN)] > 0.05, expected


def test_a_sharded_save_that_dies_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    need("torch")
    import torch
    import torch.distributed.checkpoint as dcp

    from rubick import checkpoint

    directory = str(tmp_path)
    state = {"w": torch.arange(6.0)}
    checkpoint.save_sharded(directory, 3, state, plan="dp1", extra={"k": 1})
    assert checkpoint.latest(directory) == "sharded"

    def dies(state_dict, checkpoint_id):  # writes part of a shard, then dies
        with open(os.path.join(checkpoint_id, "__0_0.distcp"), "wb") as f:
            f.write(b"torn")
        raise RuntimeError("killed mid-save")

    monkeypatch.setattr(dcp, "save", dies)
    with pytest.raises(RuntimeError):
        checkpoint.save_sharded(directory, 4, {"w": torch.zeros(6)}, plan="dp2")
    monkeypatch.undo()
    back = {"w": torch.zeros(6)}
    info = checkpoint.load_sharded(directory, back)
    assert (info["iteration"], info["plan"], info["extra"]) == (3, "dp1", {"k": 1})
    assert torch.equal(back["w"], torch.arange(6.0))
    # The next save that completes removes the torn directory and the old one.
    checkpoint.save_sharded(directory, 5, {"w": torch.ones(6)})
    assert sorted(os.listdir(directory)) == [checkpoint.sharded_info(directory)["path"], checkpoint.SHARDED]
    # A full save replaces it; and a record naming a missing directory is an error.
    checkpoint.save(directory, 6, {"w": 1})
    assert os.listdir(directory) == [checkpoint.FILE] and checkpoint.latest(directory) == "full"
    with open(os.path.join(directory, checkpoint.SHARDED), "w") as f:
        f.write('{"rubick": 1, "path": "sharded-gone"}')
    with pytest.raises(ValueError, match="sharded-gone"):
        checkpoint.sharded_info(directory)
