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
(the launcher's range); the stop signal must be one of the contract's (SIGUSR1,
SIGUSR2, SIGTERM, SIGINT).

An uncaught :class:`PlanError` ends the script with exit code 2, the contract's "this
plan cannot run here", once :func:`install_exit_hook` installed a ``sys.excepthook``
that prints the traceback as usual and then exits 2 (other exceptions are left to the
previous hook). ``import rubick`` installs nothing: ``rubick.Run``, the adapters of
:mod:`rubick.integrations` and the ``python -m`` entry points call it, and a script
that reads its plan itself calls it first.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Literal, get_args

#: What a plan offloads to the CPU: nothing, the optimizer, or the optimizer and the
#: parameters.
Offload = Literal["none", "optimizer", "all"]

#: Every :data:`Offload`.
OFFLOADS: tuple[Offload, ...] = get_args(Offload)

#: The plan string's offload tokens.
_OFFLOAD_TOKENS: dict[str, Offload] = {"offopt": "optimizer", "offall": "all"}

#: Which activations the backward recomputes: none, the attention core only
#: (selective), or every layer from its input (full: activation checkpointing).
Recompute = Literal["none", "selective", "full"]

#: Every :data:`Recompute`.
RECOMPUTES: tuple[Recompute, ...] = get_args(Recompute)

#: The plan string's recompute tokens.
_RECOMPUTE_TOKENS: dict[str, Recompute] = {"sel": "selective", "gc": "full"}

#: The exit status of a run whose plan or environment the contract refuses.
EXIT_PLAN = 2

#: The largest value of any integer variable (the launcher's fields are 32-bit unsigned).
MAX_INT = 2**32 - 1

#: The plan string's numbered tokens: prefix -> (field, smallest, largest value).
_NUMBERED: dict[str, tuple[str, int, int]] = {
    "dp": ("dp", 1, MAX_INT),
    "tp": ("tp", 1, MAX_INT),
    "pp": ("pp", 1, MAX_INT),
    "mb": ("micro_batch", 1, MAX_INT),
    "ga": ("ga", 1, MAX_INT),
    "vp": ("vp", 1, MAX_INT),
    "z": ("zero", 0, 3),
}

#: One token of a plan string: a lower-case name, then ASCII digits or none.
_TOKEN = re.compile(r"([a-z]+)([0-9]*)")

#: Signals a process cannot catch: a stop on one of them could never checkpoint.
_UNCATCHABLE = (signal.SIGKILL, signal.SIGSTOP)

#: The contract's stop signals (``rubick_core::launch::StopSignal``), the default first:
#: every other one is refused (SIGCHLD arrives whenever a child exits, SIGSEGV is a crash).
STOP_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT)

#: The most iterations a job may have (``rubick_core::limits::MAX_JOB_ITERATIONS``).
MAX_ITERATIONS = 1 << 40

_NUMBER = re.compile(r"[+-]?[0-9]+")


class PlanError(ValueError):
    """A plan variable has a value the contract does not allow (the message names it).
    Uncaught, it exits the script with :data:`EXIT_PLAN` (2) once
    :func:`install_exit_hook` was called."""


def install_exit_hook() -> None:
    """Makes an uncaught :class:`PlanError` exit 2 instead of Python's 1: the previous
    ``sys.excepthook`` prints the traceback, then ``SystemExit(2)`` (Python finalizes as
    for ``sys.exit``: ``atexit`` handlers and ``finally`` blocks of other threads run).
    Other exceptions go to the previous hook unchanged. Idempotent. ``import rubick``
    does not call it: :class:`~rubick.Run`, the adapters' callbacks, ``python -m
    rubick.torchrun`` and ``python -m rubick.integrations.torchtitan`` do, and a script
    that reads its plan itself (``Plan.from_env()``) calls it before."""
    previous = sys.excepthook
    if getattr(previous, "_rubick_exit_hook", False):
        return

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
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


@dataclass(frozen=True)
class PlanFields:
    """The fields a plan string names (see :func:`parse_plan`); ``None`` where it names
    nothing."""

    dp: int | None = None
    tp: int | None = None
    pp: int | None = None
    micro_batch: int | None = None
    ga: int | None = None
    zero: int | None = None
    offload: Offload | None = None
    recompute: Recompute | None = None
    sp: bool | None = None
    vp: int | None = None

    @property
    def gc(self) -> bool | None:
        """Full activation checkpointing (``-gc``), where the string says."""
        return None if self.recompute is None else self.recompute == "full"

    @property
    def complete(self) -> bool:
        """Whether the string names dp, tp, pp, mb and ga, as the launcher writes it."""
        return None not in (self.dp, self.tp, self.pp, self.micro_batch, self.ga)


def parse_plan(text: str) -> PlanFields:
    """The fields a plan string names: ``dp2-tp1-pp1-mb4-ga2-z1-offopt-gc`` ->
    ``PlanFields(dp=2, tp=1, pp=1, micro_batch=4, ga=2, zero=1, offload="optimizer",
    recompute="full")``; ``-sel`` is selective recompute, ``-sp`` sequence parallelism,
    ``-vpN`` N virtual pipeline stages per rank. A complete string
    (:attr:`PlanFields.complete`) also says ZeRO 0, no offload, no recompute, no
    sequence parallelism and no interleaving by leaving them out; a partial one names
    only what it names; an empty one nothing. Unknown or empty tokens, a field named
    twice and a number out of range (degrees and factors 1 to 2**32 - 1, ZeRO 0 to 3)
    are :class:`PlanError`\\ s. ``data/plan-vectors.json`` holds the test vectors this
    parser shares with rubick's."""
    text = (text or "").strip()
    numbers: dict[str, int] = {}
    offload: Offload | None = None
    recompute: Recompute | None = None
    sp: bool | None = None
    named: set[str] = set()
    for token in text.split("-") if text else ():
        match = _TOKEN.fullmatch(token)
        name, digits = match.groups() if match else (token, "")
        if name in _NUMBERED and digits:
            key, low, high = _NUMBERED[name]
            digits = digits.lstrip("0") or "0"
            value = int(digits) if len(digits) <= len(str(MAX_INT)) else MAX_INT + 1
            if not low <= value <= high:
                raise PlanError(f"RUBICK_PLAN: {token!r} in {text!r}: {key} must be {low} to {high}")
            numbers[key] = value
        elif token in _OFFLOAD_TOKENS:
            key, offload = "offload", _OFFLOAD_TOKENS[token]
        elif token in _RECOMPUTE_TOKENS:
            key, recompute = "recompute", _RECOMPUTE_TOKENS[token]
        elif token == "sp":
            key, sp = "sp", True
        elif token == "":
            raise PlanError(f"RUBICK_PLAN: an empty part in {text!r}")
        else:
            raise PlanError(f"RUBICK_PLAN: unknown part {token!r} in {text!r}")
        if key in named:
            raise PlanError(f"RUBICK_PLAN={text!r}: names {key} twice")
        named.add(key)
    plan = PlanFields(
        dp=numbers.get("dp"),
        tp=numbers.get("tp"),
        pp=numbers.get("pp"),
        micro_batch=numbers.get("micro_batch"),
        ga=numbers.get("ga"),
        zero=numbers.get("zero"),
        offload=offload,
        recompute=recompute,
        sp=sp,
        vp=numbers.get("vp"),
    )
    if not plan.complete:
        return plan
    # The launcher's form leaves the defaults out: `dp2-tp1-pp1-mb4-ga2` is ZeRO 0.
    return replace(
        plan,
        zero=plan.zero or 0,
        offload=offload or "none",
        recompute=recompute or "none",
        sp=bool(sp),
        vp=plan.vp or 1,
    )


def _int(env: Mapping[str, str], name: str, minimum: int = 0, maximum: int = MAX_INT) -> int | None:
    """The integer variable ``name`` (``None`` when unset or empty)."""
    raw = env.get(name, "").strip()
    if raw == "":
        return None
    return _to_int(name, raw, minimum, maximum)


def cpus_per_process(cpus: int, nodes: int, processes_per_node: int) -> int:
    """The cores of each worker process, as rubick computes ``RUBICK_CPUS_PER_PROCESS``:
    the run's ``cpus`` per node (over ``nodes``) over the worker processes of a node, at
    least 1; 0 when ``cpus`` is 0 (not said)."""
    if cpus <= 0:
        return 0
    return max(1, cpus // (max(1, nodes) * max(1, processes_per_node)))


def _flag(env: Mapping[str, str], name: str) -> bool | None:
    """The 0/1 variable ``name`` (``None`` when unset or empty)."""
    raw = env.get(name, "").strip().lower()
    if raw == "":
        return None
    if raw in ("1", "true", "yes"):
        return True
    if raw in ("0", "false", "no"):
        return False
    raise PlanError(f"{name}={raw!r}: expected 0 or 1")


def stop_signal(env: Mapping[str, str] | None = None) -> signal.Signals:
    """The stop signal ``RUBICK_STOP_SIGNAL`` names (``SIGUSR1`` by default; ``USR2``,
    ``SIGTERM`` and numbers also work), without reading the rest of the plan. A signal
    other than the contract's (:data:`STOP_SIGNALS`: SIGUSR1, SIGUSR2, SIGTERM, SIGINT)
    is a :class:`PlanError`."""
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
    if sig not in STOP_SIGNALS:
        raise PlanError(
            f"RUBICK_STOP_SIGNAL={raw!r}: {sig.name} is not one of the contract's stop signals; "
            "use SIGUSR1 (the default), SIGUSR2, SIGTERM or SIGINT"
        )
    return sig


def total_iterations(env: Mapping[str, str] | None = None) -> tuple[str, int] | None:
    """The iterations the launcher gives the run, with the variable that said so:
    ``RUBICK_TOTAL_ITERATIONS`` (``rubick-run``: the job's iterations in all), else
    ``RUBICK_ITERATIONS`` (``rubick-profile``: warm-up + measured); ``None`` when neither
    is set. A value that is not an integer from 1 to :data:`MAX_ITERATIONS` is a
    :class:`PlanError` naming its variable (0 would mean "train by epochs" to the HF
    Trainer, and a typo must not mean "use the script's own count")."""
    env = os.environ if env is None else env
    for name in ("RUBICK_TOTAL_ITERATIONS", "RUBICK_ITERATIONS"):
        raw = env.get(name, "")
        if raw.strip():
            return name, _to_int(name, raw, 1, MAX_ITERATIONS)
    return None


def _sources(source: Mapping[str, str]) -> str:
    """``dp from RUBICK_DP, tp from RUBICK_PLAN, ...`` for the degrees."""
    return ", ".join(f"{k} from {source.get(k, 'the default')}" for k in ("dp", "tp", "pp"))


def _offload(raw: str) -> Offload:
    """``RUBICK_OFFLOAD``'s value as an :data:`Offload`."""
    for offload in OFFLOADS:
        if raw == offload:
            return offload
    raise PlanError(f"RUBICK_OFFLOAD={raw!r}: expected one of {', '.join(OFFLOADS)}")


@dataclass(frozen=True)
class Plan:
    """A run's execution plan and resources, as the launcher set them."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    #: ZeRO stage, 0 (plain data parallelism) to 3.
    zero: int = 0
    #: What is offloaded to the CPU (:data:`Offload`).
    offload: Offload = "none"
    #: Gradient accumulation: micro-steps per iteration.
    ga: int = 1
    #: Activation recomputation (:data:`Recompute`): ``"full"`` is activation
    #: checkpointing, ``"selective"`` recomputes the attention core only.
    recompute: Recompute = "none"
    #: Samples per micro-step per data-parallel replica.
    micro_batch: int = 1
    #: Sequence parallelism beside tensor parallelism (needs tp > 1).
    sp: bool = False
    #: Virtual pipeline stages per rank (an interleaved schedule; 1: none).
    vp: int = 1
    gpus: int = 1
    nodes: int = 1
    #: This node's rank among ``nodes`` (0 on one node).
    node_rank: int = 0
    #: CPU cores the run was given, every node's together (0: not said).
    cpus: int = 0
    #: CPU cores of each worker process, what its intra-op threads should be
    #: (``RUBICK_CPUS_PER_PROCESS``; else :func:`cpus_per_process` of ``RUBICK_CPUS``
    #: over this node's processes; 0: not said). See :mod:`rubick.threads`.
    cpus_per_process: int = 0
    job: str = ""
    #: Where metric lines go (``None``: stdout).
    metrics: str | None = None
    #: Where checkpoints are written and found (``None``: nowhere).
    checkpoint_dir: str | None = None
    #: The DeepSpeed JSON the launcher wrote for this plan.
    deepspeed_config: str | None = None
    #: The signal that asks the run to checkpoint and stop.
    stop_signal: signal.Signals = signal.SIGUSR1

    @property
    def name(self) -> str:
        """The plan string (:meth:`code`)."""
        return self.code()

    @property
    def gc(self) -> bool:
        """Full activation checkpointing (``recompute == "full"``)."""
        return self.recompute == "full"

    @property
    def global_batch(self) -> int:
        """Samples per iteration: dp x micro_batch x ga."""
        return self.dp * self.micro_batch * self.ga

    @property
    def world_size(self) -> int:
        """Processes the plan needs: dp x tp x pp."""
        return self.dp * self.tp * self.pp

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Plan:
        """The plan of this run (``env`` defaults to ``os.environ``). Raises
        :class:`PlanError` naming the variable(s) when one is malformed or out of range,
        when a ``RUBICK_<FIELD>`` contradicts ``RUBICK_PLAN``, when ``RUBICK_GPUS`` is not
        dp x tp x pp, or when the plan breaks the contract's rules (offload needs ZeRO;
        offloading parameters needs ZeRO 3)."""
        env = os.environ if env is None else env
        plan_text = env.get("RUBICK_PLAN", "").strip()
        named = parse_plan(plan_text)
        #: Where each field came from, for the messages.
        source: dict[str, str] = {}

        def agree(key: str, var: str, said: object, value: object, shown: str) -> None:
            """``value`` (from ``var``), checked against what the plan string ``said``."""
            if said is not None and said != value:
                raise PlanError(
                    f"{var}={shown} contradicts RUBICK_PLAN={plan_text} ({key} {said!s}): "
                    "the per-field variable and the plan string must name the same plan"
                )
            source[key] = var

        def pick(key: str, var: str, said: int | None, default: int, minimum: int = 0, maximum: int = MAX_INT) -> int:
            """The integer field ``key``: from ``var``, else from the plan string, else ``default``."""
            value = _int(env, var, minimum, maximum)
            if value is None:
                source[key] = "the default" if said is None else "RUBICK_PLAN"
                return default if said is None else said
            agree(key, var, said, value, str(value))
            return value

        dp = pick("dp", "RUBICK_DP", named.dp, 1, 1)
        tp = pick("tp", "RUBICK_TP", named.tp, 1, 1)
        pp = pick("pp", "RUBICK_PP", named.pp, 1, 1)
        zero = pick("zero", "RUBICK_ZERO", named.zero, 0, 0, 3)
        ga = pick("ga", "RUBICK_GA", named.ga, 1, 1)
        vp = pick("vp", "RUBICK_VP", named.vp, 1, 1)
        recompute: Recompute = named.recompute or "none"
        raw_recompute = env.get("RUBICK_RECOMPUTE", "").strip().lower()
        if raw_recompute != "":
            if raw_recompute not in RECOMPUTES:
                raise PlanError(f"RUBICK_RECOMPUTE={raw_recompute!r}: expected one of {', '.join(RECOMPUTES)}")
            agree("recompute", "RUBICK_RECOMPUTE", named.recompute, raw_recompute, raw_recompute)
            recompute = next(r for r in RECOMPUTES if r == raw_recompute)
        gc = _flag(env, "RUBICK_GC")
        if gc is not None:
            # RUBICK_GC is full recompute alone: 0 leaves selective recompute as it is.
            said_gc = None if named.recompute is None and raw_recompute == "" else int(recompute == "full")
            agree("gc", "RUBICK_GC", said_gc, int(gc), str(int(gc)))
            if gc:
                recompute = "full"
        sp = _flag(env, "RUBICK_SP")
        said_sp = None if named.sp is None else int(named.sp)
        if sp is None:
            sp = bool(named.sp)
        else:
            agree("sp", "RUBICK_SP", said_sp, int(sp), str(int(sp)))
        raw_offload = env.get("RUBICK_OFFLOAD", "").strip().lower()
        offload: Offload = named.offload or "none"
        if raw_offload != "":
            offload = _offload(raw_offload)
            agree("offload", "RUBICK_OFFLOAD", named.offload, offload, raw_offload)
        if offload != "none" and zero == 0:
            raise PlanError(f"RUBICK_OFFLOAD={offload}: offloading needs ZeRO (RUBICK_ZERO >= 1)")
        if offload == "all" and zero != 3:
            raise PlanError("RUBICK_OFFLOAD=all: offloading parameters needs RUBICK_ZERO=3")
        if sp and tp == 1:
            raise PlanError(f"RUBICK_PLAN={plan_text or '-'}: sequence parallelism (sp) needs tp > 1")
        if vp > 1 and pp == 1:
            raise PlanError(f"RUBICK_PLAN={plan_text or '-'}: virtual pipeline stages (vp {vp}) need pp > 1")
        if vp > 1 and ga % pp != 0:
            raise PlanError(
                f"RUBICK_PLAN={plan_text or '-'}: an interleaved pipeline needs ga ({ga}) to be a multiple of pp ({pp})"
            )
        micro_batch = pick("micro_batch", "RUBICK_MICRO_BATCH", named.micro_batch, 1, 1)
        world = dp * tp * pp
        if world > MAX_INT:
            raise PlanError(f"dp*tp*pp = {dp}*{tp}*{pp} = {world} ({_sources(source)}): must be at most {MAX_INT}")
        gpus = _int(env, "RUBICK_GPUS", 1)
        if gpus is not None and gpus != world:
            raise PlanError(
                f"RUBICK_GPUS={gpus} but the plan needs dp*tp*pp = {dp}*{tp}*{pp} = {world} processes "
                f"({_sources(source)}): the plan does not fit the GPUs the run was given"
            )
        nodes = _int(env, "RUBICK_NODES", 1)
        nodes = 1 if nodes is None else nodes
        node_rank = _int(env, "RUBICK_NODE_RANK")
        if node_rank is None:
            node_rank = _int(env, "NODE_RANK") or 0
        if node_rank >= nodes:
            raise PlanError(f"RUBICK_NODE_RANK={node_rank}: must be below RUBICK_NODES={nodes}")
        cpus = _int(env, "RUBICK_CPUS") or 0
        per_process = _int(env, "RUBICK_CPUS_PER_PROCESS")
        if per_process is None:
            # This node's processes: torchrun's word in its workers, else the plan's share.
            local = env.get("LOCAL_WORLD_SIZE", "").strip()
            here = int(local) if local.isdigit() and int(local) > 0 else -(-world // nodes)
            per_process = cpus_per_process(cpus, nodes, here)
        return cls(
            dp=dp,
            tp=tp,
            pp=pp,
            zero=zero,
            offload=offload,
            ga=ga,
            recompute=recompute,
            micro_batch=micro_batch,
            sp=sp,
            vp=vp,
            gpus=world if gpus is None else gpus,
            nodes=nodes,
            node_rank=node_rank,
            cpus=cpus,
            cpus_per_process=per_process,
            job=env.get("RUBICK_JOB", ""),
            metrics=env.get("RUBICK_METRICS") or None,
            checkpoint_dir=env.get("RUBICK_CHECKPOINT_DIR") or None,
            deepspeed_config=env.get("RUBICK_DEEPSPEED_CONFIG") or None,
            stop_signal=_stop_signal(env.get("RUBICK_STOP_SIGNAL", "")),
        )

    def code(self) -> str:
        """The plan string as rubick writes it (``RUBICK_PLAN``), e.g.
        ``dp2-tp1-pp1-mb4-ga2-z1-offopt-gc``: dp, tp, pp, mb and ga always; interleaving,
        ZeRO, offload, sequence parallelism and recompute only when they apply."""
        code = f"dp{self.dp}-tp{self.tp}-pp{self.pp}-mb{self.micro_batch}-ga{self.ga}"
        code += f"-vp{self.vp}" if self.vp > 1 else ""
        code += f"-z{self.zero}" if self.zero else ""
        code += {"none": "", "optimizer": "-offopt", "all": "-offall"}[self.offload]
        code += "-sp" if self.sp else ""
        return code + {"none": "", "selective": "-sel", "full": "-gc"}[self.recompute]

    def check_world(self, world_size: int) -> None:
        """Raises :class:`PlanError` unless dp x tp x pp is ``world_size`` (the processes
        that were started)."""
        if self.world_size != world_size:
            raise PlanError(
                f"plan {self.code()}: dp*tp*pp = {self.dp}*{self.tp}*{self.pp} = {self.world_size} "
                f"does not match the {world_size} process(es) started"
            )
