"""The stop signal: a flag set by the signal, checked between steps.

The launcher asks a run to stop (a reconfiguration, a preemption) with the plan's
stop signal (``RUBICK_STOP_SIGNAL``, SIGUSR1 by default). The handler only sets a
flag; the run finishes the step it is in, checkpoints and exits 0. A second signal
while it saves changes nothing (the signal is blocked during the save, and the save
replaces the old checkpoint in one rename), nor does one that arrives once the run is
over (at the interpreter's exit the stop signals are ignored).
"""

from __future__ import annotations

import atexit
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, Callable


class StopFlag:
    """Set once the stop signal arrived. Install it before anything slow (``import
    torch`` takes seconds): a signal before it would kill the run."""

    def __init__(self, sig: signal.Signals = signal.SIGUSR1, *also: signal.Signals):
        #: The stop signal, and others that ask the same (e.g. SIGTERM from a launcher
        #: that shuts its workers down).
        self.signals = (sig, *[s for s in also if s != sig])
        self.signal = sig
        self._set = False
        self._previous: dict[signal.Signals, Callable[[int, FrameType | None], Any] | int | None] = {}
        for s in self.signals:
            self._previous[s] = signal.signal(s, self._handle)
            # Python installs handlers without SA_RESTART: a system call the signal
            # interrupts in *any* thread fails with EINTR, and a communication library's
            # thread (gloo's, NCCL's) may take that for a broken connection. Restart them.
            signal.siginterrupt(s, False)
        atexit.register(self._ignore)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self._set = True

    @property
    def requested(self) -> bool:
        """Whether this process got the stop signal."""
        return self._set

    def request(self) -> None:
        """Sets the flag as the signal would (tests, or a script's own reasons)."""
        self._set = True

    def agreed(self) -> bool:
        """Whether *any* rank got the signal, agreed by all ranks (one all-reduce when
        ``torch.distributed`` is initialised): every rank then stops after the same
        step, even when the signal reached only some of them."""
        torch: Any = sys.modules.get("torch")
        dist = getattr(torch, "distributed", None) if torch is not None else None
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return self._set
        device = "cpu"
        if dist.get_backend() == "nccl":
            device = f"cuda:{torch.cuda.current_device()}"
        flag = torch.tensor([1.0 if self._set else 0.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        agreed = bool(flag.item() > 0)
        released(flag)
        # Never clear the flag here: a signal that arrived during the all-reduce set it
        # after this rank's vote was taken, and votes at the next step.
        if agreed:
            self._set = True
        return agreed

    @contextmanager
    def held(self) -> Iterator[None]:
        """The stop signal blocked (queued, not lost) inside: for a save."""
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, set(self.signals))
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)

    def _ignore(self) -> None:
        """At the interpreter's exit: the run is over (stopped, finished or failed), and
        a stop signal from now on has nothing left to stop. Python's exit would restore
        the default action (death) before the process ends, and a late stop (relayed
        by torchrun to a rank that already left after the agreed stop, or after the
        script's own end) would kill a rank that finished cleanly (-10 for SIGUSR1):
        the signals are ignored instead, where this flag or any other Python handler
        (a framework's, installed over this one) still handles them. A signal set back
        to its default action on purpose stays so."""
        for s in self.signals:
            if callable(signal.getsignal(s)):
                signal.signal(s, signal.SIG_IGN)

    def uninstall(self) -> None:
        """Restores the handlers that were there before."""
        atexit.unregister(self._ignore)
        for s, previous in self._previous.items():
            signal.signal(s, previous if previous is not None else signal.SIG_DFL)


#: How long :func:`released` waits at most (a tensor held elsewhere, e.g. by a profiler).
RELEASE_S = 1.0


def released(tensor: Any, timeout: float = RELEASE_S) -> None:
    """Returns once the caller's reference is the only one left to ``tensor``, a CPU
    tensor a collective just used (bounded by ``timeout``).

    gloo's worker thread lets go of a collective's work, and with it the tensors, a
    moment *after* the collective completed (the waiting rank already runs on). Were
    the thread's the last reference, it would need the GIL to free the tensor's Python
    object; once the interpreter is finalizing (a rank that agreed to stop or finished,
    and exited at once, as a rank that writes no checkpoint does), a thread that asks
    for the GIL is ended with ``pthread_exit`` inside ``ProcessGroupGloo::runLoop``,
    whose frames cannot unwind: ``std::terminate`` ("terminate called without an
    active exception"), the rank dies with SIGABRT after its clean stop. No wait for
    other devices (NCCL's watchdog releases its works on its own schedule)."""
    use_count = getattr(tensor, "_use_count", None)
    if use_count is None or getattr(getattr(tensor, "device", None), "type", None) != "cpu":
        return
    deadline = time.monotonic() + timeout
    while use_count() > 1 and time.monotonic() < deadline:
        time.sleep(0.0002)


def install(sig: signal.Signals | None = None) -> StopFlag:
    """A :class:`StopFlag` for ``sig`` (default: the plan's, from ``RUBICK_STOP_SIGNAL``)."""
    if sig is None:
        from .plan import Plan

        sig = Plan.from_env().stop_signal
    return StopFlag(sig)
