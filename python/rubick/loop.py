"""A plain training loop under the contract, without rewriting it::

    import rubick

    with rubick.Run() as run:                      # the plan; the stop signal; OOM -> exit 3
        model, optimizer = build(run.plan)          # dp, micro_batch, ga, ... as planned
        saved = run.resume()                        # the newest checkpoint, at any plan
        if saved is not None:
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
        state = lambda: {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        for it in run.iterations(total=1000, state=state):
            with it.phase("forward"):
                loss = model(next_batch())
            with it.phase("backward_sync"):
                loss.backward()
            with it.phase("optimizer"):
                optimizer.step()
                optimizer.zero_grad()
            it.loss = loss.item()

After each iteration the loop checks the stop flag (agreed by all ranks); once it is
set, rank 0 saves ``state()`` atomically, writes the ``checkpointed`` event, and the
run exits 0. The last iteration saves too. Numbering continues across resumes.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterable, Iterator
from types import TracebackType
from typing import Any, Callable, Literal

from . import checkpoint as _checkpoint
from . import ranks as _rank
from .metrics import Iteration, Reporter
from .oom import EXIT_OOM, is_oom, report_oom
from .plan import Plan, install_exit_hook
from .stop import StopFlag
from .threads import apply as _apply_threads


def _leave_process_group() -> None:
    """Destroys torch's default process group, if one is up, before a stop exits (the
    exit skips the script's own teardown). Every rank agreed to stop and the vote's
    tensor is released (``rubick.stop.released``: what kept gloo's thread from aborting
    a rank at the interpreter's exit, "terminate called without an active exception"),
    so no collective is pending. torch is not imported for this (the package imports
    no torch)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return
    try:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception as e:  # a teardown that fails must not fail the stop
        print(f"rubick: leaving the process group: {e}", file=sys.stderr)


class Run:
    """One run of a training script under the contract (see the module's example)."""

    def __init__(
        self, plan: Plan | None = None, *, stop: StopFlag | None = None, stop_also: Iterable[signal.Signals] = ()
    ):
        install_exit_hook()  # an uncaught PlanError exits 2, reading the plan included
        #: The plan this run was launched with.
        self.plan = plan if plan is not None else Plan.from_env()
        #: The stop flag (installed now: before anything slow), on the plan's stop
        #: signal and on ``stop_also`` (e.g. SIGTERM under torchrun, which shuts its
        #: workers down with it after relaying the stop signal).
        self.stop = stop if stop is not None else StopFlag(self.plan.stop_signal, *stop_also)
        #: This process's intra-op threads, set from the plan (``None``: the user's
        #: ``OMP_NUM_THREADS``, or no cores said; :mod:`rubick.threads`).
        self.threads = _apply_threads(self.plan)
        self.reporter = Reporter(self.plan)
        #: The global iteration the checkpoint was saved at (0: a fresh start).
        self.resumed_at = 0
        #: Set once the run stopped on the signal.
        self.stopped = False

    def __enter__(self) -> Run:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        if exc is not None and is_oom(exc):
            report_oom(self.plan.metrics)
            print(f"rubick: out of memory: {exc}", file=sys.stderr)
            sys.exit(EXIT_OOM)
        return False

    def resume(self) -> Any:
        """The state of the newest complete checkpoint (``None``: start afresh); the
        next iteration is numbered after it."""
        saved = _checkpoint.load(self.plan.checkpoint_dir)
        if saved is None:
            return None
        self.resumed_at, state, at = saved
        self.reporter.next_iteration = self.resumed_at + 1
        print(
            f"rubick: resuming after iteration {self.resumed_at} (saved at {at or '?'}, now {self.plan.code()})",
            file=sys.stderr,
        )
        return state

    def checkpoint(self, state: Callable[[], Any], iteration: int) -> None:
        """Saves ``state()`` as iteration ``iteration`` (rank 0 writes; the stop signal
        is held meanwhile) and writes the ``checkpointed`` event. Every rank calls it:
        ``state()`` may gather shards collectively."""
        value = state()
        if self.plan.checkpoint_dir is None:
            return
        if _rank.is_main():
            with self.stop.held():
                _checkpoint.save(self.plan.checkpoint_dir, iteration, value, self.plan.code())
        self.reporter.event("checkpointed", iter=iteration)

    def iterations(
        self, total: int, state: Callable[[], Any] | None = None, samples: int | None = None
    ) -> Iterator[Iteration]:
        """Iterations up to global number ``total`` (after the resumed one), each timed
        and reported; ``samples`` per iteration default to the plan's global batch.
        On the stop signal (after the iteration in progress) and after the last one,
        ``state`` is checkpointed; on the signal the run then exits 0."""
        samples = self.plan.global_batch if samples is None else samples
        while self.reporter.next_iteration <= total:
            number = self.reporter.next_iteration
            with self.reporter.iteration(samples) as it:
                yield it
            if self.stop.agreed():
                self.stopped = True
                if state is not None:
                    self.checkpoint(state, number)
                print(f"rubick: stopped after iteration {number}", file=sys.stderr)
                _leave_process_group()
                sys.exit(0)
            if number == total and state is not None:
                self.checkpoint(state, number)
