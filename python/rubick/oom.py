"""Out of memory: the ``oom`` event and exit code 3, so a scheduler knows the plan
does not fit (and does not retry it as if it could)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from .metrics import _write_line

#: The exit status of a run that ran out of memory.
EXIT_OOM = 3

_MARKERS = (
    "out of memory",
    "cudnn_status_alloc_failed",
    "cublas_status_alloc_failed",
    "can't allocate memory",  # the CPU allocator's
    "cannot allocate memory",
)


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` is running out of memory: CUDA's (``torch.OutOfMemoryError``),
    the CPU allocator's (``MemoryError``), or a framework's error saying so."""
    if isinstance(exc, MemoryError):
        return True
    torch = sys.modules.get("torch")
    oom = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    if oom is not None and isinstance(exc, oom):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in _MARKERS)


def report_oom(metrics: str | None) -> None:
    """Writes the ``oom`` event (from any rank: whichever ran out says so)."""
    _write_line(metrics, {"rubick": 1, "event": "oom"})


@contextmanager
def exit_on_oom(metrics: str | None = None) -> Iterator[None]:
    """Inside, running out of memory writes the ``oom`` event and exits 3; any other
    error passes through. ``metrics`` defaults to ``RUBICK_METRICS``."""
    try:
        yield
    except BaseException as exc:  # re-raised unless it is an OOM
        if not is_oom(exc):
            raise
        if metrics is None:
            import os

            metrics = os.environ.get("RUBICK_METRICS") or None
        report_oom(metrics)
        print(f"rubick: out of memory: {exc}", file=sys.stderr)
        sys.exit(EXIT_OOM)
