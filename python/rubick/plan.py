"""The execution plan a run was launched with, read from the environment.

rubick's launcher (``rubick-profile run``, ``rubick-run apply``) sets ``RUBICK_*``
variables; ``Plan.from_env()`` reads every one of them into one typed object, so a
training script never parses them itself. A field missing from its own variable is
taken from ``RUBICK_PLAN`` (``dp2-tp1-pp1-mb4-ga2-z1-offopt-gc``), then from the
defaults of a plain single-process run. A field given both ways must agree: a
``RUBICK_<FIELD>`` that contradicts ``RUBICK_PLAN`` is a :class:`PlanError` naming both
(a complete plan string, one naming dp, tp, pp, mb and ga as the launcher writes it,
also says ZeRO 0, no offload and no activation checkpointing by leaving them out).
``RUBICK_GPUS``, when set, must be dp x tp x pp; every integer is at most 2**32 - 1
(the launcher's range); the stop signal must be one a process can catch.

An uncaught :class:`PlanError` ends the script with exit code 2, the contract's "this
plan cannot run here" (``import rubick`` installs a ``sys.excepthook`` that prints the
traceback as usual and then exits 2; other exceptions are left to the previous hook).
"""

from __future__ import annotations

import os
import re
import signal
import sys
from dataclasses import dataclass, field
from typing import Dict, Mapping, Optional, Tuple

OFFLOADS = ("none", "optimizer", "all")
_OFFLOAD_TOKENS = {"offopt": "optimizer", "offall": "all"}


#: The exit status of a run whose plan or environment the contract refuses.
EXIT_PLAN = 2

#: The largest value of any integer variable (the launcher's fields are 32-bit unsigned).
MAX_INT = 2**32 - 1

#: Signals a process cannot catch: a stop on one of them could never checkpoint.
_UNCATCHABLE = (signal.SIGKILL, signal.SIGSTOP)

_NUMBER = re.compile(r"[+-]?[0-9]+")


class PlanError(ValueError):
    """A plan variable has a value the contract does not allow (the message names it).
    Uncaught, it exits the script with :data:`EXIT_PLAN` (2) once ``rubick`` is
    imported (see :func:`install_exit_hook`)."""


def install_exit_hook() -> None:
    """Makes an uncaught :class:`PlanError` exit 2 instead of Python's 1: the previous
    ``sys.excepthook`` prints the traceback, then ``SystemExit(2)`` (Python finalizes as
    for ``sys.exit``: ``atexit`` handlers and ``finally`` blocks of other threads run).
    Other exceptions go to the previous hook unchanged. Idempotent; ``import rubick``
    calls it."""
    previous = sys.excepthook
    if getattr(previous, "_rubick_exit_hook", False):
        return

    def hook(kind, value, tb):
        previous(kind, value, tb)
        if isinstance(value, PlanError):
            print(f"rubick: exit {EXIT_PLAN}: the plan cannot run here ({value})", file=sys.stderr)
            raise SystemExit(EXIT_PLAN)

    hook._rubick_exit_hook = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def _to_int(name: str, raw: str, minimum: int = 0, maximum: int = MAX_INT) -> int:
    """``raw`` as an integer of ``[minimum, maximum]``: ASCII digits only (no ``1_000``,
    no other scripts' digits), else a :class:`PlanError` naming ``name``."""
    text = raw.strip()
    if not _NUMBER.fullmatch(text):
        raise PlanError(f"{name}={raw!r}: expected an integer")
    if len(text.lstrip("+-").lstrip("0")) > len(str(maximum)):
        raise PlanError(f"{name}={text}: must be at most {maximum}")
    value = int(text)
    if value < minimum:
        raise PlanError(f"{name}={value}: must be at least {minimum}")
    if value > maximum:
        raise PlanError(f"{name}={value}: must be at most {maximum}")
    return value


def parse_plan(text: str) -> dict:
    """The fields a plan string names: ``dp2-tp1-pp1-mb4-ga2-z1-offopt-gc`` ->
    ``{"dp": 2, "tp": 1, "pp": 1, "micro_batch": 4, "ga": 2, "zero": 1,
    "offload": "optimizer", "gc": True}``. Unknown tokens, a field named twice and a
    number out of range (degrees and factors 1 to 2**32 - 1, ZeRO 0 to 3) are errors."""
    out: dict = {}
    for token in filter(None, (text or "").strip().split("-")):
        for prefix, key in (("dp", "dp"), ("tp", "tp"), ("pp", "pp"), ("mb", "micro_batch"),
                            ("ga", "ga"), ("z", "zero")):
            rest = token[len(prefix):]
            if token.startswith(prefix) and re.fullmatch(r"[0-9]+", rest):
                low, high = (0, 3) if key == "zero" else (1, MAX_INT)
                digits = rest.lstrip("0") or "0"
                value = int(digits) if len(digits) <= len(str(MAX_INT)) else MAX_INT + 1
                if not low <= value <= high:
                    raise PlanError(f"RUBICK_PLAN: {token!r} in {text!r}: {key} must be {low} to {high}")
                break
        else:
            if token in _OFFLOAD_TOKENS:
                key, value = "offload", _OFFLOAD_TOKENS[token]
            elif token == "gc":
                key, value = "gc", True
            else:
                raise PlanError(f"RUBICK_PLAN: unknown part {token!r} in {text!r}")
        if key in out:
            raise PlanError(f"RUBICK_PLAN={text!r}: names {key} twice")
        out[key] = value
    return out


#: The fields a complete plan string (the launcher's form) always names.
_COMPLETE = ("dp", "tp", "pp", "micro_batch", "ga")


def _int(env: Mapping[str, str], name: str, default: Optional[int], minimum: int = 0,
         maximum: int = MAX_INT) -> Optional[int]:
    raw = env.get(name, "").strip()
    if raw == "":
        return default
    return _to_int(name, raw, minimum, maximum)


def stop_signal(env: Optional[Mapping[str, str]] = None) -> signal.Signals:
    """The stop signal ``RUBICK_STOP_SIGNAL`` names (``SIGUSR1`` by default; ``USR2``,
    ``SIGTERM`` and numbers also work), without reading the rest of the plan. A signal
    no process can catch (``SIGKILL``, ``SIGSTOP``) is a :class:`PlanError`."""
    env = os.environ if env is None else env
    return _stop_signal(env.get("RUBICK_STOP_SIGNAL", ""))


def _stop_signal(raw: str) -> signal.Signals:
    name = (raw or "SIGUSR1").strip().upper()
    if re.fullmatch(r"[0-9]+", name):
        try:
            sig = signal.Signals(_to_int("RUBICK_STOP_SIGNAL", name, 1, 1024))
        except ValueError:
            raise PlanError(f"RUBICK_STOP_SIGNAL={raw!r}: not a signal number") from None
    else:
        if not name.startswith("SIG"):
            name = "SIG" + name
        try:
            sig = signal.Signals[name]
        except KeyError:
            raise PlanError(f"RUBICK_STOP_SIGNAL={raw!r}: not a signal name") from None
    if sig in _UNCATCHABLE:
        raise PlanError(
            f"RUBICK_STOP_SIGNAL={raw!r}: {sig.name} cannot be caught, so a run could never checkpoint "
            "on it; use SIGUSR1 (the default), SIGUSR2, SIGTERM or SIGINT"
        )
    return sig


def _sources(source: Mapping[str, str]) -> str:
    """``dp from RUBICK_DP, tp from RUBICK_PLAN, ...`` for the degrees."""
    return ", ".join(f"{k} from {source.get(k, 'the default')}" for k in ("dp", "tp", "pp"))


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
        :class:`PlanError` naming the variable(s) when one is malformed or out of range,
        when a ``RUBICK_<FIELD>`` contradicts ``RUBICK_PLAN``, when ``RUBICK_GPUS`` is not
        dp x tp x pp, or when the plan breaks the contract's rules (offload needs ZeRO;
        offloading parameters needs ZeRO 3)."""
        env = os.environ if env is None else env
        plan_text = env.get("RUBICK_PLAN", "").strip()
        named = parse_plan(plan_text)
        if all(k in named for k in _COMPLETE):
            # The launcher's form leaves the defaults out: `dp2-tp1-pp1-mb4-ga2` is ZeRO 0.
            named = {"zero": 0, "offload": "none", "gc": False, **named}
        #: Where each field came from, for the messages.
        source: Dict[str, str] = {}

        def agree(key: str, var: str, value, shown: str):
            """``value`` (from ``var``), checked against the plan string's."""
            if key in named and named[key] != value:
                said = named[key] if not isinstance(named[key], bool) else int(named[key])
                raise PlanError(
                    f"{var}={shown} contradicts RUBICK_PLAN={plan_text} ({key} {said}): "
                    "the per-field variable and the plan string must name the same plan"
                )
            source[key] = var
            return value

        def pick(key: str, var: str, default, minimum: int = 0, maximum: int = MAX_INT):
            value = _int(env, var, None, minimum, maximum)
            if value is None:
                source[key] = "RUBICK_PLAN" if key in named else "the default"
                return named.get(key, default)
            return agree(key, var, value, str(value))

        dp = pick("dp", "RUBICK_DP", 1, 1)
        tp = pick("tp", "RUBICK_TP", 1, 1)
        pp = pick("pp", "RUBICK_PP", 1, 1)
        zero = pick("zero", "RUBICK_ZERO", 0, 0, 3)
        ga = pick("ga", "RUBICK_GA", 1, 1)
        raw_gc = env.get("RUBICK_GC", "").strip().lower()
        if raw_gc == "":
            gc = bool(named.get("gc", False))
        elif raw_gc in ("1", "true", "yes"):
            gc = agree("gc", "RUBICK_GC", True, raw_gc)
        elif raw_gc in ("0", "false", "no"):
            gc = agree("gc", "RUBICK_GC", False, raw_gc)
        else:
            raise PlanError(f"RUBICK_GC={raw_gc!r}: expected 0 or 1")
        raw_offload = env.get("RUBICK_OFFLOAD", "").strip().lower()
        if raw_offload == "":
            offload = named.get("offload", "none")
        elif raw_offload not in OFFLOADS:
            raise PlanError(f"RUBICK_OFFLOAD={raw_offload!r}: expected one of {', '.join(OFFLOADS)}")
        else:
            offload = agree("offload", "RUBICK_OFFLOAD", raw_offload, raw_offload)
        if offload != "none" and zero == 0:
            raise PlanError(f"RUBICK_OFFLOAD={offload}: offloading needs ZeRO (RUBICK_ZERO >= 1)")
        if offload == "all" and zero != 3:
            raise PlanError("RUBICK_OFFLOAD=all: offloading parameters needs RUBICK_ZERO=3")
        micro_batch = pick("micro_batch", "RUBICK_MICRO_BATCH", 1, 1)
        world = dp * tp * pp
        if world > MAX_INT:
            raise PlanError(f"dp*tp*pp = {dp}*{tp}*{pp} = {world} ({_sources(source)}): must be at most {MAX_INT}")
        gpus = _int(env, "RUBICK_GPUS", None, 1)
        if gpus is not None and gpus != world:
            raise PlanError(
                f"RUBICK_GPUS={gpus} but the plan needs dp*tp*pp = {dp}*{tp}*{pp} = {world} processes "
                f"({_sources(source)}): the plan does not fit the GPUs the run was given"
            )
        nodes = _int(env, "RUBICK_NODES", 1, 1)
        node_rank = _int(env, "RUBICK_NODE_RANK", None)
        if node_rank is None:
            node_rank = _int(env, "NODE_RANK", 0)
        if node_rank >= nodes:
            raise PlanError(f"RUBICK_NODE_RANK={node_rank}: must be below RUBICK_NODES={nodes}")
        empty = lambda v: env.get(v) or None  # noqa: E731
        plan = cls(
            dp=dp, tp=tp, pp=pp, zero=zero, offload=offload, ga=ga, gc=gc, micro_batch=micro_batch,
            gpus=world if gpus is None else gpus,
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
