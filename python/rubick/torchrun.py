"""torchrun for a run under rubick's contract: a stop exits 0, the contract's exit codes
pass through.

::

    python -m rubick.torchrun --standalone --nproc-per-node=2 train.py --its-arguments

takes torchrun's own arguments (``torch.distributed.run``) and changes four things:

* **The stop signal is handled.** The job's stop signal (``RUBICK_STOP_SIGNAL``,
  SIGUSR1 by default) is added to ``--signals-to-handle`` (torchrun's default list
  lacks SIGUSR1, and a signal torchrun does not handle kills it without a word to its
  workers); torchrun relays it to its workers, which checkpoint and exit 0. It is
  caught from the launcher's first moment, before torch is imported (seconds): a stop
  before torch's launcher took the signal over (no worker started yet) exits 0 at once.
* **A stop exits 0.** On a signal it handles, torchrun shuts its workers down with it
  and then raises ``SignalException`` ("Process N got signal: 10"), a traceback and
  exit 1, even when every worker checkpointed and exited 0. Here, when the signal is
  the job's stop signal and every worker exited 0 (or none had started), the launcher
  says so in one line on stderr and exits 0. Otherwise (a worker killed after the
  shutdown timeout, or one that crashed; another signal) torchrun's exception and exit
  1 are left as they were.
* **The contract's exit codes pass through.** torchrun exits 1 whatever its workers'
  codes; here, when the first worker to fail exited 2 (a plan it cannot run:
  :class:`~rubick.PlanError`) or 3 (out of memory), the launcher exits with that code.
* **Workers get time to checkpoint.** ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` (how long
  torchrun waits for its workers after relaying a signal before it kills them; torch's
  default is 30 s) defaults to ``RUBICK_STOP_TIMEOUT_S`` when that is set, else 120 s
  (the contract's default ``stopTimeoutS``). rubick kills whatever is left at the job's
  ``stopTimeoutS`` anyway.

rubick itself does not read the exit code of a run it stopped (``rubick-run`` records
the stop as clean when the run ended within ``stopTimeoutS``; ``rubick-profile``
counts a measurement it stopped as complete); exit 0 is the contract's word for a
clean stop, and it keeps logs and other supervisors honest.

The workers' exit codes are read from torch's process context (its
``PContext.close``); with a torch whose internals differ they cannot be read and a
stop keeps torchrun's exit 1 (a warning says so).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from types import FrameType
from typing import Any

from .oom import EXIT_OOM
from .plan import EXIT_PLAN, stop_signal

#: Exit codes of workers that pass through the launcher.
PASSED_THROUGH = (EXIT_PLAN, EXIT_OOM)

#: torchrun's own default ``--signals-to-handle``.
DEFAULT_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")

#: The local workers' exit codes at torch's last shutdown of them (``None``: still
#: running or unknown); empty until one happened.
_exits: dict[int, int | None] = {}
_watching = False


def _say(message: str) -> None:
    print(f"rubick.torchrun: {message}", file=sys.stderr, flush=True)


def _watch_workers() -> bool:
    """Records the workers' exit codes whenever torch closes its process context."""
    global _watching
    if _watching:
        return True
    try:
        from torch.distributed.elastic.multiprocessing import api
    except ImportError:
        return False
    original = getattr(getattr(api, "PContext", None), "close", None)
    if original is None:
        return False

    def close(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(self, *args, **kwargs)
        finally:
            handlers = getattr(self, "subprocess_handlers", None)
            _exits.clear()
            if isinstance(handlers, dict):
                for rank, handler in handlers.items():
                    proc = getattr(handler, "proc", None)
                    _exits[rank] = proc.poll() if proc is not None else None
            else:  # a kind of context whose workers this cannot see: not known clean
                _exits[-1] = None

    api.PContext.close = close
    _watching = True
    return True


def _signal_list(current: str | None, sig: signal.Signals) -> str:
    names = [s.strip() for s in (current or ",".join(DEFAULT_SIGNALS)).split(",") if s.strip()]
    if sig.name not in names:
        names.append(sig.name)
    return ",".join(names)


class _StoppedEarly(BaseException):
    """The stop signal before torch's launcher handles it (no worker started yet). A
    ``BaseException``: no ``except Exception`` on the way (in torch's import, in the
    rendezvous) may swallow the stop."""


def _stop_early(signum: int, frame: FrameType | None) -> None:
    signal.signal(signum, signal.SIG_IGN)  # a second stop changes nothing
    raise _StoppedEarly(signum)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs torchrun with ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    sig = stop_signal()  # a bad RUBICK_STOP_SIGNAL: PlanError, exit 2
    # Caught from here on, before anything slow (importing torch takes seconds, then the
    # rendezvous): until torch's launcher takes the signal over as it starts the
    # workers, a stop ends the launcher at once, cleanly, not killed by it (128 + N).
    signal.signal(sig, _stop_early)
    try:
        return _launch(argv, sig)
    except _StoppedEarly:
        _say(f"stopped by {sig.name} before any worker started; exit 0")
        return 0


def _launch(argv: list[str], sig: signal.Signals) -> int:
    """torchrun with ``argv``, its stop on ``sig`` and its workers' exit codes read."""
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, record

    try:
        from torch.distributed.elastic.multiprocessing.api import SignalException
    except ImportError:  # older torch
        from torch.distributed.elastic.multiprocessing import SignalException

    timeout = os.environ.get("RUBICK_STOP_TIMEOUT_S", "").strip()
    os.environ.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", timeout if timeout.isdigit() else "120")
    args = torchrun.parse_args(argv)
    if hasattr(args, "signals_to_handle"):
        args.signals_to_handle = _signal_list(args.signals_to_handle, sig)
    else:  # a torchrun without --signals-to-handle: the stop signal raises as its own do

        def handle(signum: int, frame: FrameType | None) -> None:
            raise SignalException(f"Process {os.getpid()} got signal: {signum}", sigval=signal.Signals(signum))

        signal.signal(sig, handle)
    watching = _watch_workers()
    try:
        record(torchrun.run)(args)
    except SignalException as e:
        if getattr(e, "sigval", None) != sig:
            raise
        if not watching:
            _say(f"stopped by {sig.name}, but the workers' exit codes cannot be read with this torch: exit 1")
            raise
        codes = dict(_exits)
        if any(code != 0 for code in codes.values()):
            shown = ", ".join(f"local rank {r}: {c if c is not None else 'unknown'}" for r, c in sorted(codes.items()))
            _say(f"stopped by {sig.name}, but not every worker exited 0 ({shown})")
            raise
        done = f"all {len(codes)} worker(s) exited 0" if codes else "no worker had started"
        _say(f"stopped by {sig.name}: {done}; exit 0")
        return 0
    except ChildFailedError as e:
        _, first = e.get_first_failure()
        if first.exitcode in PASSED_THROUGH:
            print(e, file=sys.stderr)
            _say(f"the first worker to fail exited {first.exitcode}: exit {first.exitcode}")
            return int(first.exitcode)
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
