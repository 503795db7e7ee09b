"""Checkpoints written atomically: a kill at any moment leaves the previous complete
checkpoint or the new one, never a torn file.

Two kinds, in ``RUBICK_CHECKPOINT_DIR``:

* **full** (:func:`save` / :func:`load`): one file, ``checkpoint.pt``, written beside its
  final name (``.tmp.<pid>``), flushed to disk, renamed over the old one, and the
  directory flushed. What is saved should be the full, unsharded state, so that a run
  resumes from it at whatever plan it now has; gathering it on one rank is what costs.
* **sharded** (:func:`save_sharded` / :func:`load_sharded`): every rank writes its own
  shards in parallel with ``torch.distributed.checkpoint`` (DCP) into a directory of its
  own (``sharded-<iteration>-<token>/``), and the save is committed by one atomic write of
  ``sharded.json`` naming it; older directories are removed after. DCP loads by
  parameter name and global offsets, so a run resumes under another DP, TP, PP layout or
  ZeRO stage: each rank reads just the slices it now holds.

A run resumes from whichever of the two holds the later iteration (:func:`latest`). A
checkpoint that cannot be used (a record naming a path outside the directory, a shard
missing, a load that fails) is a :class:`CheckpointError` naming it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import shutil
import sys
import time
import uuid
import zipfile
from typing import Any, Callable

#: The checkpoint's file name in ``RUBICK_CHECKPOINT_DIR``.
FILE = "checkpoint.pt"

#: The sharded checkpoint's commit record in ``RUBICK_CHECKPOINT_DIR``: the directory
#: DCP wrote, the iteration, the plan, and what the caller added.
SHARDED = "sharded.json"


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: its record is malformed or names a path outside
    its directory, a shard is missing or short, or the load failed (torch's own
    ``CheckpointException`` is a ``BaseException``, which ``except Exception`` misses).
    The message names the checkpoint, and the record's field when it is the cause."""


def _write_all(f: io.BufferedWriter, body: bytes) -> None:
    f.write(body)


def write_atomic(path: str, write: Callable[[io.BufferedWriter], None]) -> None:
    """Calls ``write`` on a temporary file beside ``path``, then puts it at ``path``
    in one rename (the directory is created when missing)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _dump(obj: Any, f: io.BufferedWriter) -> None:
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.save(obj, f)
    else:
        pickle.dump(obj, f, protocol=pickle.HIGHEST_PROTOCOL)


def _load(path: str, mmap: bool = False) -> Any:
    """What :func:`_dump` wrote, by the file's format (not by whether this process
    imported torch): ``torch.save``'s zip archive, else a pickle. ``mmap``: the tensors
    mapped from the file, not read."""
    if zipfile.is_zipfile(path):
        import torch

        # Our own files: the state holds optimizer objects, not only tensors.
        return torch.load(path, map_location="cpu", weights_only=False, mmap=mmap)
    with open(path, "rb") as f:
        return pickle.load(f)


def save(directory: str, iteration: int, state: Any, plan: str = "") -> str:
    """Saves ``state`` (anything ``torch.save`` or ``pickle`` takes) as the checkpoint
    of global iteration ``iteration``; returns its path."""
    path = os.path.join(directory, FILE)
    write_atomic(path, lambda f: _dump({"rubick": 1, "iteration": iteration, "plan": plan, "state": state}, f))
    remove_sharded(directory)
    return path


def remove_sharded(directory: str) -> None:
    """Removes the sharded checkpoint from ``directory`` (its record first): what a full
    save that replaced it calls."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(directory, SHARDED))
    for entry in os.listdir(directory):
        if entry.startswith("sharded-"):
            shutil.rmtree(os.path.join(directory, entry), ignore_errors=True)


def load(directory: str | None) -> tuple[int, Any, str] | None:
    """The newest complete checkpoint in ``directory``: (iteration, state, plan it was
    saved at), or ``None`` when there is none. Leftover temporary files of a killed
    save are ignored."""
    if not directory:
        return None
    path = os.path.join(directory, FILE)
    if not os.path.exists(path):
        return None
    saved = _load(path)
    if not isinstance(saved, dict) or saved.get("rubick") != 1:
        raise ValueError(f"{path}: not a checkpoint written by rubick")
    return int(saved["iteration"]), saved["state"], str(saved.get("plan", ""))


def _dist() -> Any:
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def sharded_info(directory: str | None) -> dict[str, Any] | None:
    """The commit record of the newest sharded checkpoint in ``directory`` (its
    ``iteration``, ``plan``, ``path`` and what :func:`save_sharded` was given as
    ``extra``), or ``None`` when there is none. A record that is malformed, or whose
    ``path`` is not a directory of ``directory`` itself (an absolute path, ``..``, a
    symbolic link out of it), is a :class:`CheckpointError` naming the record and the
    field."""
    if not directory:
        return None
    path = os.path.join(directory, SHARDED)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        try:
            info = json.load(f)
        except json.JSONDecodeError as e:
            raise CheckpointError(f"{path}: not JSON ({e})") from None
    if not isinstance(info, dict) or info.get("rubick") != 1 or "path" not in info:
        raise CheckpointError(f"{path}: not a sharded checkpoint record written by rubick")
    _inside(path, directory, info["path"])
    iteration = info.get("iteration")
    if type(iteration) is not int or iteration < 0:
        raise CheckpointError(f"{path}: field 'iteration' = {iteration!r}: expected an iteration (an integer >= 0)")
    return info


def _inside(record: str, directory: str, name: Any) -> str:
    """The directory a record's ``path`` field names, checked to be an entry of
    ``directory`` that resolves inside it (what :func:`save_sharded` writes)."""
    where = f"{record}: field 'path' = {name!r}"
    if not isinstance(name, str) or name in ("", ".", "..") or os.path.basename(name) != name or "\0" in name:
        raise CheckpointError(f"{where}: not the name of a directory in {directory} (refused)")
    root = os.path.realpath(directory)
    target = os.path.realpath(os.path.join(directory, name))
    if os.path.dirname(target) != root:
        raise CheckpointError(f"{where}: resolves to {target}, outside {directory} (refused)")
    if not os.path.isdir(target):
        raise CheckpointError(f"{where}: names {name}, which is not in {directory}")
    return target


def _full_iteration(path: str) -> int:
    """The iteration a full checkpoint (:func:`save`'s, or a script's own with an
    ``iteration`` key) was saved at; its tensors are mapped, not read, where torch can."""
    try:
        saved = _load(path, mmap=True)
    except Exception as e:
        raise CheckpointError(f"{path}: cannot be read ({type(e).__name__}: {e})") from e
    iteration = saved.get("iteration") if isinstance(saved, dict) else None
    if type(iteration) is not int:
        raise CheckpointError(f"{path}: no 'iteration' (not a checkpoint written by rubick or its examples)")
    return iteration


def latest(directory: str | None) -> str | None:
    """Which checkpoint a run resumes from: ``"sharded"``, ``"full"`` or ``None``. When
    both are there (a kill between one save's commit and its removal of the other), the
    one of the later iteration; at the same iteration (the same state) ``"sharded"``,
    whatever the files' times."""
    if not directory:
        return None
    info = sharded_info(directory)
    full = os.path.join(directory, FILE)
    if info is None:
        return "full" if os.path.exists(full) else None
    if not os.path.exists(full):
        return "sharded"
    return "full" if _full_iteration(full) > int(info["iteration"]) else "sharded"


def verify_sharded(path: str) -> None:
    """Raises :class:`CheckpointError` naming ``path`` (a DCP checkpoint directory)
    unless its metadata reads and every shard it names is there, as long as it says."""
    import torch.distributed.checkpoint as dcp

    try:
        metadata = dcp.FileSystemReader(path).read_metadata()
    except Exception as e:
        raise CheckpointError(f"{path}: its metadata cannot be read ({type(e).__name__}: {e})") from e
    needed: dict[str, int] = {}
    for item in (getattr(metadata, "storage_data", None) or {}).values():
        name = getattr(item, "relative_path", None)
        if isinstance(name, str):
            end = int(getattr(item, "offset", 0)) + int(getattr(item, "length", 0))
            needed[name] = max(needed.get(name, 0), end)
    for name, end in sorted(needed.items()):
        shard = os.path.join(path, name)
        try:
            size = os.path.getsize(shard)
        except OSError:
            raise CheckpointError(f"{path}: shard {name} is missing") from None
        if size < end:
            raise CheckpointError(f"{path}: shard {name} is {size} bytes, its metadata needs {end} (torn)")


def save_sharded(
    directory: str, iteration: int, state_dict: dict[str, Any], plan: str = "", extra: dict[str, Any] | None = None
) -> float:
    """Saves ``state_dict`` (DCP's kind: tensors, DTensors, sharded or replicated, by
    name) as the checkpoint of global iteration ``iteration``; every rank of the default
    process group calls it. Each rank writes its shards in parallel (replicated tensors
    once); rank 0 then verifies it (:func:`verify_sharded`), commits it by writing the
    record, and only then removes the previous checkpoints (sharded and full). A kill at
    any moment, or a save that fails (a :class:`CheckpointError` on every rank where DCP
    raised its ``BaseException``), leaves the previous checkpoint. Returns the seconds
    the save took."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    start = time.perf_counter()
    dist = _dist()
    rank = dist.get_rank() if dist else 0
    chosen: list[str | None] = [f"sharded-{iteration:09d}-{uuid.uuid4().hex[:8]}" if rank == 0 else None]
    if dist:
        dist.broadcast_object_list(chosen, src=0)
    name = str(chosen[0])
    if rank == 0:
        os.makedirs(os.path.join(directory, name), exist_ok=True)
    if dist:
        dist.barrier()
    try:
        dcp.save(state_dict, checkpoint_id=os.path.join(directory, name))
    except CheckpointException as e:  # a BaseException: `except Exception` would miss it
        raise CheckpointError(f"{os.path.join(directory, name)}: the save of iteration {iteration} failed ({e})") from e
    # Every rank's shards are written (DCP's save returns once the coordinator has
    # everyone's results and wrote the metadata). Rank 0 verifies them before it commits:
    # the previous checkpoint is removed only once this one is verified and committed.
    failure: list[str | None] = [None]
    if rank == 0:
        try:
            verify_sharded(os.path.join(directory, name))
        except CheckpointError as e:
            failure[0] = str(e)
    if dist:
        dist.broadcast_object_list(failure, src=0)
    if failure[0] is not None:
        raise CheckpointError(f"the save of iteration {iteration} is not committed: {failure[0]}")
    if rank == 0:
        record = {
            "rubick": 1,
            "format": "dcp",
            "iteration": iteration,
            "plan": plan,
            "path": name,
            "extra": extra or {},
        }
        body = json.dumps(record, sort_keys=True).encode() + b"\n"
        write_atomic(os.path.join(directory, SHARDED), lambda f: _write_all(f, body))
        for entry in os.listdir(directory):
            if entry.startswith("sharded-") and entry != name:
                shutil.rmtree(os.path.join(directory, entry), ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(directory, FILE))
    if dist:
        dist.barrier()
    return time.perf_counter() - start


def load_sharded(directory: str | None, state_dict: dict[str, Any]) -> dict[str, Any] | None:
    """Loads the newest sharded checkpoint in ``directory`` into ``state_dict`` in place
    (every rank of the default process group calls it, each with the tensors it now holds
    under its plan: DCP reads the slices they cover). Returns its record (see
    :func:`sharded_info`, with ``load_s`` added), or ``None`` when there is none. A
    checkpoint that cannot be loaded (a shard missing, a load that fails) is a
    :class:`CheckpointError` naming it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    info = sharded_info(directory)
    if info is None or directory is None:
        return None
    start = time.perf_counter()
    path = os.path.join(directory, info["path"])
    verify_sharded(path)
    try:
        dcp.load(state_dict, checkpoint_id=path)
    except (Exception, CheckpointException) as e:
        raise CheckpointError(
            f"{path}: the sharded checkpoint of iteration {info['iteration']} cannot be loaded ({e})"
        ) from e
    return dict(info, load_s=time.perf_counter() - start)
