"""rubick.integrations.hf without a Trainer run: the run's directories and the plan win
over the arguments given (with a warning), the import is fast, old checkpoints are
pruned."""

import os

import pytest
from helpers import need, run_python

from rubick import Plan, PlanError


def test_output_dir_cannot_replace_checkpoint_dir(tmp_path, capsys):
    need("torch", "transformers", "accelerate")
    from rubick.integrations import hf

    run_dir, theirs = str(tmp_path / "run-ckpt"), str(tmp_path / "their-out")
    plan = Plan.from_env({"RUBICK_PLAN": "dp1-tp1-pp1-mb4-ga2", "RUBICK_CHECKPOINT_DIR": run_dir})
    args = hf.training_arguments(plan, output_dir=theirs, max_steps=5, per_device_train_batch_size=8)
    assert args.output_dir == run_dir, "the run's checkpoint directory wins"
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (4, 2), "the plan's batch"
    err = capsys.readouterr().err
    assert f"training_arguments(output_dir={theirs!r}) ignored" in err and run_dir in err, err
    assert "training_arguments(per_device_train_batch_size=8) ignored" in err, err
    # resume_from_checkpoint pointing elsewhere is replaced by the run's newest (none yet).
    args = hf.training_arguments(plan, resume_from_checkpoint=str(tmp_path / "other" / "checkpoint-9"))
    assert args.resume_from_checkpoint is None
    assert "training_arguments(resume_from_checkpoint=" in capsys.readouterr().err
    # The run's own directory passed again: no warning.
    hf.training_arguments(plan, output_dir=run_dir)
    assert "ignored" not in capsys.readouterr().err
    # A plain run (no RUBICK_CHECKPOINT_DIR): the argument is used as given.
    args = hf.training_arguments(Plan.from_env({}), output_dir=theirs)
    assert args.output_dir == theirs and capsys.readouterr().err == ""


def test_rubick_hf_imports_transformers_only_when_needed(tmp_path):
    need("transformers")
    run = run_python(
        "import sys\n"
        "from rubick.integrations import hf\n"
        "callback = hf.RubickCallback()\n"
        "assert 'transformers' not in sys.modules, 'imported transformers'\n"
        "assert 'torch' not in sys.modules, 'imported torch'\n"
        "from transformers import TrainerCallback\n"
        "for event in [m for m in dir(TrainerCallback) if m.startswith('on_')]:\n"
        "    getattr(callback, event)\n"
        "print('ok')\n"
    )
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-3000:]


def test_old_checkpoints_are_pruned_to_the_newest(tmp_path, monkeypatch):
    import rubick.integrations.hf as hf

    out = tmp_path / "out"

    def make(step, complete=True):
        path = out / f"checkpoint-{step}"
        path.mkdir(parents=True)
        (path / "weights.bin").write_bytes(b"x" * 100)
        if complete:
            (path / hf.COMPLETE).write_text(f"{step}\n")
        return str(path)

    for step in (10, 20):
        make(step)
    torn = make(25, complete=False)  # a save killed half-way
    newest = make(30)
    future_torn = make(40, complete=False)
    assert hf.last_checkpoint(str(out)) == newest
    removed = hf.prune_checkpoints(str(out), 1, written=newest)
    assert sorted(removed) == sorted([str(out / "checkpoint-10"), str(out / "checkpoint-20"), torn])
    assert sorted(os.listdir(out)) == ["checkpoint-30", "checkpoint-40"], "no leftovers of the prune"
    assert hf.last_checkpoint(str(out)) == newest and os.path.isdir(future_torn)
    # keep 2, and a protected one (the one resumed from) survives whatever keep says.
    resumed = make(5)
    make(50)
    hf.prune_checkpoints(str(out), 1, written=str(out / "checkpoint-50"), protected=[resumed])
    assert sorted(os.listdir(out)) == ["checkpoint-5", "checkpoint-50"]
    make(60)
    hf.prune_checkpoints(str(out), 2, written=str(out / "checkpoint-60"))
    assert sorted(os.listdir(out)) == ["checkpoint-50", "checkpoint-60"]
    # An interrupted prune (renamed, not yet deleted) is never resumed, and is cleaned next time.
    os.rename(out / "checkpoint-50", out / ".rubick-pruned-checkpoint-50.1")
    assert hf.last_checkpoint(str(out)) == str(out / "checkpoint-60")
    hf.prune_checkpoints(str(out), 1, written=str(out / "checkpoint-60"))
    assert os.listdir(out) == ["checkpoint-60"]
    # 0 keeps all; RUBICK_KEEP_CHECKPOINTS configures the callback; a bad value names it.
    make(70)
    assert hf.prune_checkpoints(str(out), 0, written=str(out / "checkpoint-70")) == []
    monkeypatch.setenv("RUBICK_KEEP_CHECKPOINTS", "3")
    assert hf.RubickCallback(plan=Plan.from_env({})).keep_checkpoints == 3
    assert hf.RubickCallback(plan=Plan.from_env({}), keep_checkpoints=0).keep_checkpoints == 0
    monkeypatch.setenv("RUBICK_KEEP_CHECKPOINTS", "-1")
    with pytest.raises(PlanError, match="RUBICK_KEEP_CHECKPOINTS"):
        hf.RubickCallback(plan=Plan.from_env({}))


@pytest.mark.parametrize("raw", ["0", "-5", "abc", "1.5", str(2**41)])
def test_the_runs_iterations_must_be_a_positive_integer(raw, monkeypatch):
    """issue 40: "`RUBICK_TOTAL_ITERATIONS=0` means "epochs" to the HF Trainer
    (max_steps<=0)"."""
    need("torch", "transformers", "accelerate")
    from rubick.integrations import hf

    monkeypatch.setenv("RUBICK_TOTAL_ITERATIONS", raw)
    with pytest.raises(PlanError, match="RUBICK_TOTAL_ITERATIONS="):
        hf.training_arguments(Plan.from_env({}), max_steps=10)


def test_the_runs_iterations_replace_max_steps_only_with_a_warning(monkeypatch, capsys):
    """issue 40: "`training_arguments` (hf.py) replaces `max_steps` silently"."""
    need("torch", "transformers", "accelerate")
    from rubick.integrations import hf

    monkeypatch.delenv("RUBICK_TOTAL_ITERATIONS", raising=False)
    monkeypatch.setenv("RUBICK_ITERATIONS", "7")  # a profile: warm-up + measured
    args = hf.training_arguments(Plan.from_env({}), max_steps=1000)
    assert args.max_steps == 7, "the run's iterations win"
    err = capsys.readouterr().err
    assert "training_arguments(max_steps=1000) ignored: the run's iterations win (RUBICK_ITERATIONS=7)" in err, err
    # The same count passed, or none: no warning; RUBICK_TOTAL_ITERATIONS comes first.
    monkeypatch.setenv("RUBICK_TOTAL_ITERATIONS", "12")
    assert hf.training_arguments(Plan.from_env({}), max_steps=12).max_steps == 12
    assert hf.training_arguments(Plan.from_env({})).max_steps == 12
    assert "ignored" not in capsys.readouterr().err
    # Without the launcher's count, the script's own is used.
    monkeypatch.delenv("RUBICK_TOTAL_ITERATIONS")
    monkeypatch.delenv("RUBICK_ITERATIONS")
    assert hf.training_arguments(Plan.from_env({}), max_steps=1000).max_steps == 1000


def test_the_callback_leaves_the_process_group_at_exit(tmp_path):
    """A user's Trainer script written from the README (no ``destroy_process_group`` of
    its own) finished its 400 iterations and its checkpoint, then a rank aborted in the
    interpreter's teardown of gloo ("terminate called without an active exception"): exit
    1. The callback leaves the process group at exit, before that teardown."""
    need("torch", "transformers")
    run = run_python(
        "import atexit, torch.distributed as dist\n"
        "from rubick.integrations import hf\n"
        "callback = hf.RubickCallback()\n"
        f"dist.init_process_group('gloo', init_method='file://{tmp_path}/store', rank=0, world_size=1)\n"
        "atexit.register(lambda: print('left' if not dist.is_initialized() else 'still in'))\n"
        "callback.on_train_end(None, None, None)\n",
        unset=("RUBICK_PLAN", "RUBICK_METRICS"),
    )
    assert run.returncode == 0 and run.stdout.strip() == "left", (run.stdout, run.stderr[-3000:])
