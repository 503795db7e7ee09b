"""Checkpoints written atomically: a kill at any moment leaves the previous complete
checkpoint or the new one, never a torn file.

The file is written beside its final name (``.tmp.<pid>``), flushed to disk, renamed
over the old one, and the directory flushed. A run resumes from the file if there is
one, at whatever plan it now has: what is saved should be the full, unsharded state.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import sys
from typing import Any, Callable

#: The checkpoint's file name in ``RUBICK_CHECKPOINT_DIR``.
FILE = "checkpoint.pt"


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


def _load(path: str) -> Any:
    torch = sys.modules.get("torch")
    if torch is not None:
        # Our own files: the state holds optimizer objects, not only tensors.
        return torch.load(path, map_location="cpu", weights_only=False)
    with open(path, "rb") as f:
        return pickle.load(f)


def save(directory: str, iteration: int, state: Any, plan: str = "") -> str:
    """Saves ``state`` (anything ``torch.save`` or ``pickle`` takes) as the checkpoint
    of global iteration ``iteration``; returns its path."""
    path = os.path.join(directory, FILE)
    write_atomic(path, lambda f: _dump({"rubick": 1, "iteration": iteration, "plan": plan, "state": state}, f))
    return path


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
