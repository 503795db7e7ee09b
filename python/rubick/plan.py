"""The execution plan a run was launched with, read from the environment.

rubick's launcher (``rubick-profile run``, ``rubick-run apply``) sets ``RUBICK_*``
variables; ``Plan.from_env()`` reads every one of them into one typed object, so a
training script never parses them itself. A field missing from its own variable is
taken from ``RUBICK_PLAN`` (``dp2-tp1-pp1-mb4-ga2-z1-offopt-gc``), then from the
defaults of a plain single-process run.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from typing import Mapping, Optional

OFFLOADS = ("none", "optimizer", "all")
_OFFLOAD_TOKENS = {"offopt": "optimizer", "offall": "all"}


class PlanError(ValueError):
    """A plan variable has a value the contract does not allow (the message names it)."""


def parse_plan(text: str) -> dict:
    """The fields a plan string names: ``dp2-tp1-pp1-mb4-ga2-z1-offopt-gc`` ->
    ``{"dp": 2, "tp": 1, "pp": 1, "micro_batch": 4, "ga": 2, "zero": 1,
    "offload": "optimizer", "gc": True}``. Unknown tokens are errors."""
    out: dict = {}
    for token in filter(None, (text or "").strip().split("-")):
        for prefix, key in (("dp", "dp"), ("tp", "tp"), ("pp", "pp"), ("mb", "micro_batch"),
                            ("ga", "ga"), ("z", "zero")):
            rest = token[len(prefix):]
            if token.startswith(prefix) and rest.isdigit():
                out[key] = int(rest)
                break
        else:
            if token in _OFFLOAD_TOKENS:
                out["offload"] = _OFFLOAD_TOKENS[token]
            elif token == "gc":
                out["gc"] = True
            else:
                raise PlanError(f"RUBICK_PLAN: unknown part {token!r} in {text!r}")
    return out


def _int(env: Mapping[str, str], name: str, default: Optional[int], minimum: int = 0) -> Optional[int]:
    raw = env.get(name, "").strip()
    if raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise PlanError(f"{name}={raw!r}: expected an integer") from None
    if value < minimum:
        raise PlanError(f"{name}={value}: must be at least {minimum}")
    return value


def stop_signal(env: Optional[Mapping[str, str]] = None) -> signal.Signals:
    """The stop signal ``RUBICK_STOP_SIGNAL`` names (``SIGUSR1`` by default; ``USR2``,
    ``SIGTERM`` and numbers also work), without reading the rest of the plan."""
    env = os.environ if env is None else env
    return _stop_signal(env.get("RUBICK_STOP_SIGNAL", ""))


def _stop_signal(raw: str) -> signal.Signals:
    name = (raw or "SIGUSR1").strip().upper()
    if name.isdigit():
        try:
            return signal.Signals(int(name))
        except ValueError:
            raise PlanError(f"RUBICK_STOP_SIGNAL={raw!r}: not a signal number") from None
    if not name.startswith("SIG"):
        name = "SIG" + name
    try:
        return signal.Signals[name]
    except KeyError:
        raise PlanError(f"RUBICK_STOP_SIGNAL={raw!r}: not a signal name") from None


@dataclass(frozen=True)
class Plan:
    """A run's execution plan and resources, as the launcher set them."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    #: ZeRO stage, 0 (plain data parallelism) to 3.
    zero: int = 0
    #: ``none``, ``optimizer`` or ``all`` (optimizer and parameters) offloaded to the CPU.
    offload: str = "none"
    #: Gradient accumulation: micro-steps per iteration.
    ga: int = 1
    #: Activation (gradient) checkpointing.
    gc: bool = False
    #: Samples per micro-step per data-parallel replica.
    micro_batch: int = 1
    gpus: int = 1
    nodes: int = 1
    #: This node's rank among ``nodes`` (0 on one node).
    node_rank: int = 0
    #: CPU cores the run was given (0: not said).
    cpus: int = 0
    job: str = ""
    #: Where metric lines go (``None``: stdout).
    metrics: Optional[str] = None
    #: Where checkpoints are written and found (``None``: nowhere).
    checkpoint_dir: Optional[str] = None
    #: The DeepSpeed JSON the launcher wrote for this plan.
    deepspeed_config: Optional[str] = None
    #: The signal that asks the run to checkpoint and stop.
    stop_signal: signal.Signals = signal.SIGUSR1
    #: The plan string, e.g. ``dp2-tp1-pp1-mb4-ga2-z1``.
    name: str = field(default="", compare=False)

    @property
    def global_batch(self) -> int:
        """Samples per iteration: dp x micro_batch x ga."""
        return self.dp * self.micro_batch * self.ga

    @property
    def world_size(self) -> int:
        """Processes the plan needs: dp x tp x pp."""
        return self.dp * self.tp * self.pp

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None) -> "Plan":
        """The plan of this run (``env`` defaults to ``os.environ``). Raises
        :class:`PlanError` naming the variable when one is malformed or the plan breaks
        the contract's rules (offload needs ZeRO; offloading parameters needs ZeRO 3)."""
        env = os.environ if env is None else env
        named = parse_plan(env.get("RUBICK_PLAN", ""))

        def pick(key: str, var: str, default, minimum: int = 0):
            value = _int(env, var, None, minimum)
            return named.get(key, default) if value is None else value

        dp = pick("dp", "RUBICK_DP", 1, 1)
        tp = pick("tp", "RUBICK_TP", 1, 1)
        pp = pick("pp", "RUBICK_PP", 1, 1)
        zero = pick("zero", "RUBICK_ZERO", 0)
        if zero > 3:
            raise PlanError(f"RUBICK_ZERO={zero}: must be 0 to 3")
        ga = pick("ga", "RUBICK_GA", 1, 1)
        raw_gc = env.get("RUBICK_GC", "").strip().lower()
        if raw_gc in ("", ):
            gc = bool(named.get("gc", False))
        elif raw_gc in ("1", "true", "yes"):
            gc = True
        elif raw_gc in ("0", "false", "no"):
            gc = False
        else:
            raise PlanError(f"RUBICK_GC={raw_gc!r}: expected 0 or 1")
        offload = (env.get("RUBICK_OFFLOAD", "").strip().lower() or named.get("offload", "none"))
        if offload not in OFFLOADS:
            raise PlanError(f"RUBICK_OFFLOAD={offload!r}: expected one of {', '.join(OFFLOADS)}")
        if offload != "none" and zero == 0:
            raise PlanError(f"RUBICK_OFFLOAD={offload}: offloading needs ZeRO (RUBICK_ZERO >= 1)")
        if offload == "all" and zero != 3:
            raise PlanError("RUBICK_OFFLOAD=all: offloading parameters needs RUBICK_ZERO=3")
        micro_batch = pick("micro_batch", "RUBICK_MICRO_BATCH", 1, 1)
        nodes = _int(env, "RUBICK_NODES", 1, 1)
        node_rank = _int(env, "RUBICK_NODE_RANK", None)
        if node_rank is None:
            node_rank = _int(env, "NODE_RANK", 0)
        if node_rank >= nodes:
            raise PlanError(f"RUBICK_NODE_RANK={node_rank}: must be below RUBICK_NODES={nodes}")
        empty = lambda v: env.get(v) or None  # noqa: E731
        plan = cls(
            dp=dp, tp=tp, pp=pp, zero=zero, offload=offload, ga=ga, gc=gc, micro_batch=micro_batch,
            gpus=_int(env, "RUBICK_GPUS", dp * tp * pp, 0),
            nodes=nodes,
            node_rank=node_rank,
            cpus=_int(env, "RUBICK_CPUS", 0),
            job=env.get("RUBICK_JOB", ""),
            metrics=empty("RUBICK_METRICS"),
            checkpoint_dir=empty("RUBICK_CHECKPOINT_DIR"),
            deepspeed_config=empty("RUBICK_DEEPSPEED_CONFIG"),
            stop_signal=_stop_signal(env.get("RUBICK_STOP_SIGNAL", "")),
            name="",
        )
        object.__setattr__(plan, "name", plan.code())
        return plan

    def code(self) -> str:
        """The plan string, e.g. ``dp2-tp1-pp1-mb4-ga2-z1-offopt-gc``."""
        s = f"dp{self.dp}-tp{self.tp}-pp{self.pp}-mb{self.micro_batch}-ga{self.ga}-z{self.zero}"
        s += {"none": "", "optimizer": "-offopt", "all": "-offall"}[self.offload]
        return s + ("-gc" if self.gc else "")

    def check_world(self, world_size: int) -> None:
        """Raises :class:`PlanError` unless dp x tp x pp is ``world_size`` (the processes
        that were started)."""
        if self.world_size != world_size:
            raise PlanError(
                f"plan {self.code()}: dp*tp*pp = {self.dp}*{self.tp}*{self.pp} = {self.world_size} "
                f"does not match the {world_size} process(es) started"
            )
