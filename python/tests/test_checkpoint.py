"""rubick.checkpoint's sharded records and the choice between kinds: a record naming a
path outside its directory is refused, the later iteration is resumed from whatever the
files' times, and a checkpoint that cannot be loaded is a clear error that never costs
the previous loadable one."""

import json
import os
import re

import pytest
from helpers import need, run_python

from rubick import checkpoint


def record(directory, path, iteration=3):
    """A sharded commit record naming `path`, as save_sharded writes one."""
    body = {"rubick": 1, "format": "dcp", "iteration": iteration, "plan": "", "path": path, "extra": {}}
    with open(os.path.join(directory, checkpoint.SHARDED), "w") as f:
        json.dump(body, f)


def test_a_record_pointing_outside_its_directory_is_refused(tmp_path):
    """issue 40: "a sharded-checkpoint record's `path` can point outside its directory
    and is loaded (the error message claims a check that is never made)"."""
    directory = tmp_path / "ckpt"
    elsewhere = tmp_path / "elsewhere"
    directory.mkdir()
    elsewhere.mkdir()
    (directory / "sharded-000000003-abcd0123").mkdir()
    (directory / "sharded-000000003-link").symlink_to(elsewhere, target_is_directory=True)
    record(str(directory), "sharded-000000003-abcd0123")
    assert checkpoint.sharded_info(str(directory))["path"] == "sharded-000000003-abcd0123"
    for path in (
        str(elsewhere),  # absolute
        "../elsewhere",
        "sharded-000000003-abcd0123/../../elsewhere",
        "sharded-000000003-link",  # a symbolic link out of the directory
        ".",
        "",
        7,
    ):
        record(str(directory), path)
        message = f"{directory / checkpoint.SHARDED}: field 'path' = {path!r}"
        for read in (checkpoint.sharded_info, checkpoint.latest):
            with pytest.raises(ValueError) as e:
                read(str(directory))
            assert str(e.value).startswith(message), (path, str(e.value))
            assert type(e.value).__name__ == "CheckpointError"


def test_latest_picks_the_later_iteration_not_the_newer_file(tmp_path):
    """issue 40: "`latest()` compares mtimes, not iterations as its docstring says"."""
    directory = str(tmp_path)
    checkpoint.save(directory, 9, {"w": 1})
    full = os.path.join(directory, checkpoint.FILE)
    os.makedirs(os.path.join(directory, "sharded-000000003-abcd0123"))
    for iteration, expected in ((3, "full"), (12, "sharded"), (9, "sharded")):
        record(directory, "sharded-000000003-abcd0123", iteration)
        sharded = os.path.join(directory, checkpoint.SHARDED)
        # Whichever file was written last, the later iteration wins; at a tie, sharded.
        for older, newer in ((full, sharded), (sharded, full)):
            os.utime(older, (1_000_000, 1_000_000))
            os.utime(newer, (2_000_000, 2_000_000))
            assert checkpoint.latest(directory) == expected, (iteration, os.path.basename(newer))


def test_a_checkpoint_that_cannot_be_loaded_is_a_clear_error_and_never_costs_the_previous_one(tmp_path, monkeypatch):
    """issue 40: "a deleted shard raises torch's `CheckpointException` (a BaseException)
    after the older checkpoint was pruned"."""
    need("torch")
    import torch
    import torch.distributed.checkpoint as dcp

    directory = str(tmp_path)
    checkpoint.save_sharded(directory, 3, {"w": torch.arange(6.0)}, plan="dp1")

    # A save whose shard is gone before the commit is not committed, and the previous
    # checkpoint stays, loadable.
    save = dcp.save

    def loses_a_shard(state_dict, checkpoint_id):
        save(state_dict, checkpoint_id=checkpoint_id)
        for name in os.listdir(checkpoint_id):
            if name.endswith(".distcp"):
                os.unlink(os.path.join(checkpoint_id, name))

    monkeypatch.setattr(dcp, "save", loses_a_shard)
    with pytest.raises(ValueError, match=r"the save of iteration 4 is not committed: .* is missing"):
        checkpoint.save_sharded(directory, 4, {"w": torch.zeros(6)}, plan="dp2")
    monkeypatch.undo()
    back = {"w": torch.zeros(6)}
    assert checkpoint.load_sharded(directory, back)["iteration"] == 3
    assert torch.equal(back["w"], torch.arange(6.0))

    # A shard deleted after the commit: an Exception (not torch's BaseException) naming
    # the checkpoint.
    checkpoint.save_sharded(directory, 5, {"w": torch.ones(6)})
    path = os.path.join(directory, checkpoint.sharded_info(directory)["path"])
    shard = next(n for n in os.listdir(path) if n.endswith(".distcp"))
    os.unlink(os.path.join(path, shard))
    with pytest.raises(Exception, match=re.escape(f"{path}: shard {shard} is missing")) as e:
        checkpoint.load_sharded(directory, {"w": torch.zeros(6)})
    assert type(e.value).__name__ == "CheckpointError"

    # A load DCP itself refuses (a key the checkpoint lacks): the same.
    checkpoint.save_sharded(directory, 6, {"w": torch.ones(6)})
    path = os.path.join(directory, checkpoint.sharded_info(directory)["path"])
    with pytest.raises(ValueError, match=re.escape(path) + ": .*iteration 6 cannot be loaded"):
        checkpoint.load_sharded(directory, {"other": torch.zeros(6)})


def test_a_full_checkpoint_loads_whether_or_not_the_reader_imported_torch(tmp_path):
    """Found with the tests above: a checkpoint pickled by a script without torch could
    not be loaded by a process that had imported torch ("Invalid magic number")."""
    need("torch")
    import torch  # noqa: F401  (the reader has torch; the writer below does not)

    run = run_python(
        "import sys\nfrom rubick import checkpoint\n"
        f"checkpoint.save({str(tmp_path)!r}, 4, {{'w': 8}}, 'dp1')\n"
        "assert 'torch' not in sys.modules\n"
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert checkpoint.load(str(tmp_path)) == (4, {"w": 8}, "dp1")
