"""Metric lines: one JSON object per iteration, written by rank 0 only.

The protocol (what ``rubick-profile`` and ``rubick-run`` read)::

    {"rubick":1,"iter":7,"iter_time_s":0.18,"forward_s":0.06,"backward_sync_s":0.11,
     "optimizer_s":0.012,"samples":16,"peak_memory_gib":0.75,"loss":5.79}
    {"rubick":1,"event":"checkpointed","iter":20}
    {"rubick":1,"event":"oom"}

Lines are appended to ``RUBICK_METRICS`` (stdout when unset) and flushed one by one,
so a reader sees every complete line even while the run goes on.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from . import ranks as _rank

if TYPE_CHECKING:
    from .plan import Plan

PHASES = ("forward", "backward_sync", "optimizer")


def write_line(path: str | None, obj: dict[str, Any]) -> None:
    """Appends one JSON line to ``path`` (stdout when ``None``) in one write."""
    _write_line(path, obj)


def _write_line(path: str | None, obj: dict[str, Any]) -> None:
    line = json.dumps(obj, separators=(",", ":")) + "\n"
    if path:
        # One write of the whole line, appended: lines from several writers never interleave.
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    else:
        sys.stdout.write(line)
        sys.stdout.flush()


def peak_memory_gib() -> float:
    """Peak memory of this process: CUDA's max allocated on a GPU run (when torch is
    imported and CUDA is up), else the peak resident set."""
    torch: Any = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        return float(torch.cuda.max_memory_allocated()) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def _synchronize() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class Reporter:
    """Times iterations and writes their metric lines (on rank 0; other ranks time and
    write nothing).

    ::

        reporter = Reporter(plan)
        for step in ...:
            with reporter.iteration(samples=plan.global_batch) as it:
                with it.phase("forward"):
                    loss = model(batch)
                with it.phase("backward_sync"):
                    loss.backward()
                with it.phase("optimizer"):
                    optimizer.step()
                it.loss = loss.item()
    """

    def __init__(self, plan: Plan | None = None, *, metrics: str | None = None, first_iteration: int = 1):
        self.path = metrics if metrics is not None else (plan.metrics if plan is not None else None)
        #: The global number the next iteration gets (a resumed run continues).
        self.next_iteration = first_iteration
        self.main = _rank.is_main()

    def write(self, obj: dict[str, Any]) -> None:
        """A raw line (``rubick: 1`` is added), from rank 0 only."""
        if self.main:
            _write_line(self.path, {"rubick": 1, **obj})

    def event(self, name: str, **fields: Any) -> None:
        """An event line, e.g. ``checkpointed`` with ``iter``."""
        self.write({"event": name, **fields})

    @contextmanager
    def iteration(self, samples: int, loss: float | None = None) -> Iterator[Iteration]:
        """One iteration: its phases timed inside, its line written when it ends (not
        when it raised)."""
        it = Iteration(self.next_iteration, samples, loss)
        _synchronize()
        start = time.perf_counter()
        yield it
        _synchronize()
        it.time_s = time.perf_counter() - start
        self.next_iteration += 1
        self.write(it.line())


class Iteration:
    """One iteration being timed (see :meth:`Reporter.iteration`)."""

    def __init__(self, number: int, samples: int, loss: float | None):
        self.number = number
        self.samples = samples
        self.loss = loss
        self.time_s = 0.0
        self.phases: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Times one phase (``forward``, ``backward_sync`` or ``optimizer``); phases of
        the same name add up (accumulation's micro-steps)."""
        if name not in PHASES:
            raise ValueError(f"phase {name!r}: expected one of {', '.join(PHASES)}")
        _synchronize()
        start = time.perf_counter()
        try:
            yield
        finally:
            _synchronize()
            self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - start

    def line(self) -> dict[str, Any]:
        """The iteration's metric line (without ``rubick: 1``)."""
        out: dict[str, Any] = {"iter": self.number, "iter_time_s": round(self.time_s, 6)}
        for name in PHASES:
            if name in self.phases:
                out[f"{name}_s"] = round(self.phases[name], 6)
        out["samples"] = self.samples
        out["peak_memory_gib"] = round(peak_memory_gib(), 4)
        if self.loss is not None:
            out["loss"] = float(self.loss)
        return out
