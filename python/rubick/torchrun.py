"""torchrun for a run under rubick's contract: a stop exits 0, the contract's exit codes
pass through.

::

    python -m rubick.torchrun --standalone --nproc-per-node=2 train.py --its-arguments

takes torchrun's own arguments (``torch.distributed.run``) and changes five things:

* **The stop signal is handled.** The job's stop signal (``RUBICK_STOP_SIGNAL``,
  SIGUSR1 by default) is added to ``--signals-to-handle`` (torchrun's default list
  lacks SIGUSR1, and a signal torchrun does not handle kills it without a word to its
  workers); torchrun relays it to its workers, which checkpoint and exit 0. It is
  caught from the launcher's first moment, before torch is imported (seconds): a stop
  before torch's launcher took the signal over (no worker started yet) exits 0 at once.
  A stop is handled once: while torch shuts the workers down on it, another stop
  (rubick signals every process of a run) is ignored instead of breaking that off.
  A worker gets the stop only once it catches it (its script's handler installed, up
  to ``RELAY_WAIT_S``): a worker just started is not killed by it. Once torch's
  launcher returned (the workers ended), a stop is ignored: nothing is left to stop.
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
* **Threads per worker, from the plan.** Each worker's ``OMP_NUM_THREADS`` (its intra-op
  threads) is ``RUBICK_CPUS_PER_PROCESS``, else ``RUBICK_CPUS`` per node over the
  ``--nproc-per-node`` workers (at least 1), unless ``OMP_NUM_THREADS`` is set (the
  user's: it wins, with a warning when it oversubscribes the node's cores). torchrun's
  own default is 1 thread whatever the cores (:mod:`rubick.threads`).
* **Workers get time to checkpoint.** ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` (how long
  torchrun waits for its workers after relaying a signal before it kills them; torch's
  default is 30 s) defaults to ``RUBICK_STOP_TIMEOUT_S`` when that is set, else 120 s
  (the contract's default ``stopTimeoutS``). rubick kills whatever is left at the job's
  ``stopTimeoutS`` anyway.

rubick itself does not judge a run it stopped by its exit code (``rubick-run`` records
the stop as clean when the run ended within ``stopTimeoutS``; ``rubick-profile``
counts a measurement it stopped as complete, and its row's ``reason`` says so when the
exit was not 0); exit 0 is the contract's word for a clean stop, and it keeps logs,
profile rows and other supervisors honest.

The workers' exit codes are read from torch's process context (its
``PContext.close``); with a torch whose internals differ they cannot be read and a
stop keeps torchrun's exit 1 (a warning says so).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Sequence
from types import FrameType
from typing import Any

from .oom import EXIT_OOM
from .plan import EXIT_PLAN, install_exit_hook, stop_signal
from .threads import VAR, for_workers

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


#: How long the stop waits for a worker to catch it before it is relayed anyway.
RELAY_WAIT_S = 30.0


def _catches(pid: int, sig: signal.Signals) -> bool:
    """Whether process ``pid`` catches or ignores ``sig`` now, or has exited (Linux's
    ``/proc``; where it cannot be read: assumed)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            status = dict(line.split(":", 1) for line in f if ":" in line)
    except OSError:
        return True
    if status.get("State", "").strip()[:1] in ("Z", "X", ""):
        return True
    bit = 1 << (int(sig) - 1)
    return any(int(status.get(k, "0").strip() or "0", 16) & bit for k in ("SigCgt", "SigIgn"))


def _relay_when_caught(sig: signal.Signals) -> None:
    """torch relays the stop to a worker only once the worker catches it: a worker
    stopped before its script installed its handler (Python's start, ``import rubick``)
    would die of it (-10) instead of checkpointing. Bounded by ``RELAY_WAIT_S``."""
    try:
        from torch.distributed.elastic.multiprocessing.subprocess_handler import SubprocessHandler
    except ImportError:
        return
    original = SubprocessHandler.close
    if getattr(original, "_rubick", False):
        return

    def close(self: Any, death_sig: signal.Signals | None = None) -> Any:
        proc = getattr(self, "proc", None)
        if death_sig == sig and proc is not None:
            deadline = time.monotonic() + RELAY_WAIT_S
            while not _catches(proc.pid, sig) and time.monotonic() < deadline:
                time.sleep(0.02)
        return original(self, death_sig)

    close._rubick = True  # type: ignore[attr-defined]
    SubprocessHandler.close = close


def _handle_signals(sig: signal.Signals) -> None:
    """torch's handler of the signals it handles (it raises ``SignalException``; torch
    then shuts its workers down with the signal), with two changes:

    * a signal that comes while torch starts the workers is held until they all run,
      then raised. Raised in the middle, it left the workers already started unknown
      to torch: never stopped, running on after the launcher exited ("no worker had
      started").
    * the stop ``sig`` is handled once: from then on it is ignored. torch is shutting
      the workers down on it (relayed, waited for); a second stop (rubick signals every
      process of a run, and a stop may be sent again) raised inside that shutdown and
      broke it off: the workers left unwaited for, their exit codes unknown, exit 1
      with a traceback after a clean stop."""
    try:
        from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
        from torch.distributed.elastic.multiprocessing import api
    except ImportError:
        return
    terminate = getattr(api, "_terminate_process_handler", None)
    original = getattr(LocalElasticAgent, "_start_workers", None)
    if terminate is None or original is None or getattr(original, "_rubick", False):
        return
    held: list[int | None] = [None]
    starting = [False]

    def raised(signum: int, frame: FrameType | None) -> None:
        if signum == sig:
            signal.signal(sig, signal.SIG_IGN)  # the shutdown under way is the stop
        terminate(signum, frame)

    def handler(signum: int, frame: FrameType | None) -> None:
        if starting[0]:
            held[0] = signum
        else:
            raised(signum, frame)

    def start_workers(self: Any, *args: Any, **kwargs: Any) -> Any:
        starting[0] = True
        try:
            return original(self, *args, **kwargs)
        finally:
            starting[0] = False
            signum, held[0] = held[0], None
            if signum is not None:
                raised(signum, None)

    start_workers._rubick = True  # type: ignore[attr-defined]
    api._terminate_process_handler = handler  # what torch installs as it starts them
    LocalElasticAgent._start_workers = start_workers


def _then_ignore(run: Any, sig: signal.Signals) -> Any:
    """``run``, after which ``sig`` is ignored: once torch's launcher returned (its
    workers ended, or were shut down on a stop), a stop has nothing left to stop, and
    torch's handler would raise it anywhere in the launcher's own exit (a traceback,
    exit 1), or Python's exit would let it kill the launcher."""

    def ran(args: Any) -> Any:
        try:
            return run(args)
        finally:
            signal.signal(sig, signal.SIG_IGN)

    return ran


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
    install_exit_hook()
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
    threads, warning = for_workers(getattr(args, "nproc_per_node", None), getattr(args, "nnodes", 1))
    if warning is not None:
        _say(f"warning: {warning}")
    if threads is not None:  # torchrun passes its environment to the workers
        os.environ[VAR] = str(threads)
    if hasattr(args, "signals_to_handle"):
        args.signals_to_handle = _signal_list(args.signals_to_handle, sig)
    else:  # a torchrun without --signals-to-handle: the stop signal raises as its own do

        def handle(signum: int, frame: FrameType | None) -> None:
            raise SignalException(f"Process {os.getpid()} got signal: {signum}", sigval=signal.Signals(signum))

        signal.signal(sig, handle)
    watching = _watch_workers()
    _relay_when_caught(sig)
    _handle_signals(sig)
    try:
        record(_then_ignore(torchrun.run, sig))(args)
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
