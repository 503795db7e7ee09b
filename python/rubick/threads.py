"""Intra-op threads per worker process, from the plan.

A run's cores are shared by its worker processes: each should run as many intra-op
threads (OpenMP's, torch's) as it has cores, ``RUBICK_CPUS_PER_PROCESS`` (the cores of
a node over its worker processes, one per GPU; on a CPU node the plan's "GPUs" are the
worker processes), never the run's cores in all (``RUBICK_CPUS``): with ``OMP_NUM_THREADS``
set to those, each of dp2's two workers on 2 cores ran 2 threads, and the job ran 2.9x
slower than predicted (issue 42).

The launchers set them: ``python -m rubick.torchrun`` gives the workers it starts
``OMP_NUM_THREADS`` (:func:`for_workers`), and :class:`~rubick.Run`, the Trainers'
callbacks (:mod:`rubick.integrations.hf`, :mod:`rubick.integrations.lightning`) and
:mod:`rubick.integrations.torchtitan` set their own process's (:func:`apply`), **unless
the user set them**: ``OMP_NUM_THREADS`` present in the process's environment wins,
whoever set it (the job's ``env``, the shell, a launcher: plain torchrun sets 1 for its
workers when nothing did), and so does a script's own ``torch.set_num_threads`` after
rubick's. Where the run's cores are not said (``RUBICK_CPUS`` unset or 0), nothing is
set.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from .plan import Plan, _to_int, cpus_per_process

#: The variable a user sets to choose the threads themselves (OpenMP's, which torch reads).
VAR = "OMP_NUM_THREADS"


def per_process(plan: Plan | None = None, env: Mapping[str, str] | None = None) -> int | None:
    """The intra-op threads this run's worker processes should have, or ``None``: the
    user set ``OMP_NUM_THREADS``, or the run's cores are not said."""
    env = os.environ if env is None else env
    if env.get(VAR, "").strip():
        return None
    plan = plan if plan is not None else Plan.from_env(env)
    return plan.cpus_per_process or None


def apply(plan: Plan | None = None) -> int | None:
    """Sets this process's intra-op threads from ``plan`` (default: the environment's)
    unless the user set them (see the module): ``OMP_NUM_THREADS`` in the environment
    (read by torch when it is imported after this, and by the processes this one
    starts), and ``torch.set_num_threads`` when torch is imported already. Returns the
    threads set (``None``: none)."""
    threads = per_process(plan)
    if threads is None:
        return None
    os.environ[VAR] = str(threads)
    torch: Any = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "set_num_threads"):
        torch.set_num_threads(threads)
    return threads


def _count(value: Any) -> int | None:
    """A launcher's count (``--nproc-per-node``, ``--nnodes``; ``1:4`` is its most), when
    it is a number (``auto``, ``gpu``: not known here)."""
    text = str(value if value is not None else "").strip().split(":")[-1]
    return int(text) if text.isdigit() and int(text) > 0 else None


def for_workers(
    processes_per_node: Any, nodes: Any = 1, env: Mapping[str, str] | None = None
) -> tuple[int | None, str | None]:
    """``OMP_NUM_THREADS`` for the workers a launcher starts (``processes_per_node`` on
    each of ``nodes``), and a warning where the user's own would oversubscribe the
    node's cores. The threads: ``RUBICK_CPUS_PER_PROCESS`` (rubick's, from the plan),
    else ``RUBICK_CPUS`` per node over the workers; ``None`` when the user set
    ``OMP_NUM_THREADS`` or the run's cores are not said."""
    env = os.environ if env is None else env
    procs, nodes_n = _count(processes_per_node), _count(nodes) or 1
    raw_cpus = env.get("RUBICK_CPUS", "").strip()
    cpus = _to_int("RUBICK_CPUS", raw_cpus) if raw_cpus else 0
    per_node = cpus // nodes_n if cpus else 0
    user = env.get(VAR, "").strip()
    if user:
        if user.isdigit() and procs and per_node and int(user) * procs > per_node:
            return None, (
                f"{VAR}={user} for each of {procs} workers: {int(user) * procs} threads on this node's "
                f"{per_node} cores (the run's cores per process: {max(1, per_node // procs)}; "
                "`{cpus_per_process}` in the job's env says so)"
            )
        return None, None
    raw = env.get("RUBICK_CPUS_PER_PROCESS", "").strip()
    if raw:
        return (_to_int("RUBICK_CPUS_PER_PROCESS", raw) or None), None
    if procs is None:
        return None, None
    return (cpus_per_process(cpus, nodes_n, procs) or None), None
