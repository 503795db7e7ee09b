"""rubick: the training-script side of rubick's job contract.

A script launched by ``rubick-profile run`` or ``rubick-run apply`` gets its execution
plan in ``RUBICK_*`` variables and owes the launcher four things: metric lines (one
JSON line per iteration from rank 0), a clean stop on the stop signal (finish the
step, checkpoint atomically, the ``checkpointed`` event, exit 0), a resume from the
newest checkpoint at whatever plan the new run has, and, out of memory, the ``oom``
event with exit 3. This package is that, once:

* :class:`Plan` — the plan and resources from the environment; :func:`parse_plan`
  reads a plan string into :class:`PlanFields`;
* :class:`Reporter` — iteration timing (forward / backward+sync / optimizer) and
  metric lines;
* :class:`StopFlag` — the stop signal as a flag, agreed by all ranks;
* :mod:`rubick.checkpoint` — atomic save and load;
* :func:`exit_on_oom` — the ``oom`` event and exit 3;
* :class:`Run` — all of it around a plain loop;
* :mod:`rubick.threads` — each worker's intra-op threads from the plan (the run's
  cores per process), unless the user set ``OMP_NUM_THREADS``;
* :mod:`rubick.integrations` — the adapters to frameworks that own the training loop
  (Hugging Face's and Lightning's Trainers, torchtitan);
* ``python -m rubick.torchrun`` — torchrun that exits 0 after a stop;
* :func:`install_exit_hook` — an uncaught :class:`PlanError` exits 2 (the contract's
  bad plan), not Python's 1. Importing the package changes nothing in the process:
  :class:`Run`, the adapters and the ``python -m`` entry points install the hook; a
  script that reads its plan itself calls it first.

Standard library only; torch is used when the script imported it.
"""

from . import checkpoint, threads
from .loop import Run
from .metrics import Iteration, Reporter, peak_memory_gib
from .oom import EXIT_OOM, exit_on_oom, is_oom
from .plan import (
    EXIT_PLAN,
    OFFLOADS,
    RECOMPUTES,
    Offload,
    Plan,
    PlanError,
    PlanFields,
    Recompute,
    install_exit_hook,
    parse_plan,
)
from .ranks import is_main, rank, world_size
from .stop import StopFlag

__all__ = [
    "EXIT_OOM",
    "EXIT_PLAN",
    "OFFLOADS",
    "RECOMPUTES",
    "Iteration",
    "Offload",
    "Plan",
    "PlanError",
    "PlanFields",
    "Recompute",
    "Reporter",
    "Run",
    "StopFlag",
    "checkpoint",
    "exit_on_oom",
    "install_exit_hook",
    "is_main",
    "is_oom",
    "parse_plan",
    "peak_memory_gib",
    "rank",
    "threads",
    "world_size",
]
