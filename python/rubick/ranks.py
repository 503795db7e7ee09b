"""Which process this is: the global rank and the world size, from torchrun's (or
Slurm's) variables, else from an initialised ``torch.distributed``, else 0 of 1."""

from __future__ import annotations

import os
import sys
from typing import Any


def _distributed() -> Any:
    """``torch.distributed`` when the script imported torch and initialised it, else ``None``."""
    torch = sys.modules.get("torch")  # only when the script imported it
    if torch is None:
        return None
    dist = getattr(torch, "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist
    return None


def rank() -> int:
    """This process's global rank."""
    dist = _distributed()
    if dist is not None:
        return int(dist.get_rank())
    for var in ("RANK", "SLURM_PROCID"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def world_size() -> int:
    """How many processes run the job."""
    dist = _distributed()
    if dist is not None:
        return int(dist.get_world_size())
    for var in ("WORLD_SIZE", "SLURM_NTASKS"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 1


def is_main() -> bool:
    """Whether this is rank 0 (the one that writes metric lines and checkpoints)."""
    return rank() == 0
