"""Hugging Face Transformers: the contract for a `Trainer` without rewriting its loop.

::

    import rubick.integrations.hf                        # fast: transformers is not imported yet
    callback = rubick.integrations.hf.RubickCallback()   # the stop signal caught from here on

    from transformers import Trainer                     # the slow imports after it

    args = rubick.integrations.hf.training_arguments(max_steps=1000, learning_rate=3e-4)  # the plan mapped
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
    with rubick.exit_on_oom():
        trainer.train(resume_from_checkpoint=rubick.integrations.hf.last_checkpoint(args.output_dir))

What is mapped: micro-batch -> ``per_device_train_batch_size``, accumulation ->
``gradient_accumulation_steps``, checkpointing -> ``gradient_checkpointing``, ZeRO ->
the launcher's DeepSpeed JSON when DeepSpeed imports, else FSDP (ZeRO 2 ->
``shard_grad_op``, 3 -> ``full_shard``, offload -> ``offload``; ZeRO 1 has no FSDP
counterpart and runs as ``shard_grad_op``), the checkpoint directory ->
``output_dir`` (the Trainer's own checkpoints, resumed by the Trainer at the next
global step, at any data parallelism), ``RUBICK_TOTAL_ITERATIONS`` (else a profile's
``RUBICK_ITERATIONS``) -> ``max_steps`` (a positive integer, else a
:class:`~rubick.PlanError`; it wins over a ``max_steps`` passed, with a warning).
What cannot be: tensor and pipeline parallelism (the Trainer has no switch for them):
a plan with tp or pp > 1 is a :class:`~rubick.PlanError` (exit 2 for the launcher).

The run's directories win: under rubick (``RUBICK_CHECKPOINT_DIR`` set) an
``output_dir`` (or ``logging_dir``, ``resume_from_checkpoint``) passed to
:func:`training_arguments` is replaced by the run's, with a warning on stderr naming
the argument: a fixed ``output_dir`` would make every run resume (and profile) some
other run's checkpoint. Without ``RUBICK_CHECKPOINT_DIR`` (a plain run) the argument is
used as given. The plan's own fields (batch, accumulation, checkpointing, sharding) win
the same way, with the same warning when the value passed differs, and so does the run's
iteration count over ``max_steps``: a profile runs its warm-up + measured steps, a run
the job's iterations, whatever the script's own default.

``import rubick.integrations.hf`` does not import transformers (``training_arguments``
and the Trainer do), so the callback, whose stop flag is installed when it is made, can
be created before anything slow.

The callback writes one metric line per optimizer step (``iter`` is the Trainer's
global step; ``backward_sync_s`` is forward + backward + gradient sync, which the
Trainer does not separate; ``optimizer_s`` the step; ``loss`` when the Trainer logs
it, every step under this mapping), saves and stops after the step in progress on the
stop signal (the ``checkpointed`` event once the Trainer's checkpoint is complete),
and saves after the last step. After each save it prunes the output directory to the
newest ``keep_checkpoints`` complete checkpoints (``RUBICK_KEEP_CHECKPOINTS``, default
1; 0 keeps all): one checkpoint per reconfiguration would otherwise pile up. The one
just written is always kept, and so is every checkpoint until a newer one is complete
(the one a run resumed from goes only once the run saved past it); a checkpoint is
removed by renaming it out of :func:`last_checkpoint`'s sight in one step, then
deleting it, so a kill at any moment leaves the newest complete checkpoint in place.
A torn save (no completion mark) older than the one just written is removed too.
"""

from __future__ import annotations

import atexit
import inspect
import os
import re
import shutil
import sys
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Callable

from .. import ranks as _rank
from ..metrics import Reporter, peak_memory_gib
from ..plan import Plan, PlanError, _to_int, install_exit_hook, total_iterations
from ..stop import StopFlag
from ..threads import apply as _apply_threads

if TYPE_CHECKING:  # imported for real only when needed (it takes seconds)
    from transformers import TrainerControl, TrainerState, TrainingArguments

#: Written into a Trainer checkpoint once it is complete (after the Trainer's save).
COMPLETE = "rubick-complete"

#: How many complete checkpoints a run keeps (the newest ones) when nothing says.
KEEP_CHECKPOINTS = 1

#: Arguments naming a directory (or a path in one) that the run owns.
RUN_PATHS = ("output_dir", "logging_dir", "resume_from_checkpoint")

#: The prefix of a checkpoint being pruned (renamed first: never resumed from).
_PRUNED = ".rubick-pruned-"


def _warn(message: str) -> None:
    if _rank.is_main():
        print(f"rubick: warning: {message}", file=sys.stderr, flush=True)


def training_arguments(plan: Plan | None = None, **overrides: Any) -> TrainingArguments:
    """``TrainingArguments`` for this run's plan; ``overrides`` (any of its fields) win,
    except the plan's own (batch, accumulation, checkpointing, sharding) and, under
    rubick (``plan.checkpoint_dir`` set), the run's directories: ``output_dir`` is the
    run's checkpoint directory, ``logging_dir`` is left to the Trainer and
    ``resume_from_checkpoint`` is the run's newest complete checkpoint; and the run's
    iterations (:func:`rubick.plan.total_iterations`) are ``max_steps``. An override the
    run replaces is named in a warning on stderr (rank 0) when its value differs;
    nothing is replaced silently. Raises :class:`~rubick.PlanError` for a plan the
    Trainer cannot run (tp or pp > 1) and for an iteration count that is not a positive
    integer (0 would make the Trainer count epochs instead)."""
    plan = plan if plan is not None else Plan.from_env()
    if plan.tp > 1 or plan.pp > 1:
        raise PlanError(f"plan {plan.code()}: the Trainer has no tensor or pipeline parallelism (tp, pp must be 1)")
    total = total_iterations()  # a bad count is refused before the slow imports
    import torch
    from transformers import TrainingArguments

    fields = inspect.signature(TrainingArguments.__init__).parameters
    cpu = not torch.cuda.is_available()
    output_dir = overrides.pop("output_dir", None)
    if plan.checkpoint_dir:
        run_paths = {
            "output_dir": plan.checkpoint_dir,
            "logging_dir": None,
            "resume_from_checkpoint": last_checkpoint(plan.checkpoint_dir),
        }
        if output_dir is not None:
            overrides["output_dir"] = output_dir
        for name in RUN_PATHS:
            if name not in overrides:
                continue
            given = overrides.pop(name)
            if given is not None and os.fspath(given) != run_paths[name]:
                _warn(
                    f"training_arguments({name}={os.fspath(given)!r}) ignored: the run's directories win "
                    f"(RUBICK_CHECKPOINT_DIR={plan.checkpoint_dir!r}; {name} = {run_paths[name]!r})"
                )
            if name == "resume_from_checkpoint":
                overrides[name] = run_paths[name]
        output_dir = plan.checkpoint_dir
    kwargs: dict[str, Any] = dict(
        output_dir=output_dir or "rubick-checkpoints",
        logging_steps=1,
        report_to="none",
        disable_tqdm=True,
        save_strategy="no",  # the callback saves: on the stop signal and after the last step
        save_only_model=False,
        use_cpu=cpu,
        dataloader_num_workers=0,
    )
    if cpu and int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        kwargs["ddp_backend"] = "gloo"
    # rubick-run: the job's iterations in all; rubick-profile: warm-up + measured. The
    # run's count wins over the script's (the launcher planned for it, and a profile runs
    # its warm-up + measured steps whatever the script's own count), with a warning.
    if total is not None:
        var, steps = total
        given = overrides.get("max_steps")
        if given is not None and given != steps:
            _warn(f"training_arguments(max_steps={given!r}) ignored: the run's iterations win ({var}={steps})")
        overrides["max_steps"] = steps
    kwargs.update(overrides)
    # Transformers 5 renamed `gradient_checkpointing` to `activation_checkpointing`.
    checkpointing = "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"
    planned: dict[str, Any] = {
        "per_device_train_batch_size": plan.micro_batch,
        "gradient_accumulation_steps": plan.ga,
        checkpointing: plan.gc,
    }
    if plan.zero > 0:
        try:
            import deepspeed  # noqa: F401

            planned["deepspeed"] = plan.deepspeed_config
        except ImportError:
            mode = "full_shard" if plan.zero == 3 else "shard_grad_op"
            planned["fsdp"] = mode + (" offload" if plan.offload != "none" else "")
    for name, value in planned.items():
        if name in overrides and overrides[name] != value:
            _warn(f"training_arguments({name}={overrides[name]!r}) ignored: the plan {plan.code()} says {value!r}")
    kwargs.update(planned)
    return TrainingArguments(**kwargs)


def checkpoints_to_keep(env: Any | None = None) -> int:
    """How many complete Trainer checkpoints a run keeps: ``RUBICK_KEEP_CHECKPOINTS``
    (0: all), else :data:`KEEP_CHECKPOINTS`. A bad value is a :class:`~rubick.PlanError`."""
    env = os.environ if env is None else env
    raw = env.get("RUBICK_KEEP_CHECKPOINTS", "").strip()
    return KEEP_CHECKPOINTS if raw == "" else _to_int("RUBICK_KEEP_CHECKPOINTS", raw, 0)


def _checkpoints(output_dir: str) -> list[tuple[int, str, bool]]:
    """(step, path, complete) of every ``checkpoint-N`` in ``output_dir``."""
    found = []
    for name in os.listdir(output_dir):
        m = re.fullmatch(r"checkpoint-([0-9]+)", name)
        path = os.path.join(output_dir, name)
        if m and os.path.isdir(path):
            found.append((int(m.group(1)), path, os.path.exists(os.path.join(path, COMPLETE))))
    return sorted(found)


def prune_checkpoints(
    output_dir: str, keep: int, written: str | None = None, protected: Iterable[str] = ()
) -> list[str]:
    """Removes the complete checkpoints of ``output_dir`` but the newest ``keep`` (0:
    none removed), and the torn ones (no completion mark) older than ``written`` (the
    checkpoint just saved), never ``written`` nor a path in ``protected``. Each goes in
    one rename (out of :func:`last_checkpoint`'s sight) before it is deleted; leftovers
    of an interrupted prune are deleted too. Returns the checkpoints removed."""
    if keep <= 0 or not os.path.isdir(output_dir):
        return []
    keep_paths = {os.path.abspath(p) for p in protected}
    if written is not None:
        keep_paths.add(os.path.abspath(written))
    found = _checkpoints(output_dir)
    complete = [(step, path) for step, path, done in found if done]
    keep_paths.update(os.path.abspath(path) for _, path in complete[-keep:])
    newest_kept = max((step for step, path, _ in found if os.path.abspath(path) in keep_paths), default=None)
    doomed = [
        path
        for step, path, done in found
        if os.path.abspath(path) not in keep_paths and (done or (newest_kept is not None and step < newest_kept))
    ]
    removed = []
    for path in doomed:
        hidden = os.path.join(output_dir, f"{_PRUNED}{os.path.basename(path)}.{os.getpid()}")
        try:
            os.replace(path, hidden)
        except OSError as e:
            _warn(f"cannot prune {path}: {e}")
            continue
        removed.append(path)
    if removed:
        fd = os.open(output_dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    for name in os.listdir(output_dir):
        if name.startswith(_PRUNED):
            shutil.rmtree(os.path.join(output_dir, name), ignore_errors=True)
    return removed


def last_checkpoint(output_dir: str | None) -> str | None:
    """The newest complete Trainer checkpoint (``checkpoint-N`` holding the mark this
    callback writes after the Trainer's save) in ``output_dir``: a save killed half-way
    is never resumed from. ``None`` when there is none."""
    if not output_dir or not os.path.isdir(output_dir):
        return None
    complete = [path for _, path, done in _checkpoints(output_dir) if done]
    return complete[-1] if complete else None


#: The Trainer's callback events (``TrainerCallback``'s methods), each a no-op here
#: unless :class:`RubickCallback` defines it.
_EVENTS = (
    "on_init_end",
    "on_train_begin",
    "on_train_end",
    "on_epoch_begin",
    "on_epoch_end",
    "on_step_begin",
    "on_pre_optimizer_step",
    "on_optimizer_step",
    "on_substep_end",
    "on_step_end",
    "on_evaluate",
    "on_predict",
    "on_save",
    "on_log",
    "on_prediction_step",
    "on_push_begin",
)


class RubickCallback:
    """The contract for a `Trainer` (see the module's documentation). A callback in
    the Trainer's sense (every ``on_*`` event; those it does not use do nothing) that
    does not derive from ``transformers.TrainerCallback``, so that making it imports
    nothing slow: make it first thing, its stop flag is installed then.

    ``keep_checkpoints``: the complete checkpoints kept after each save (default
    ``RUBICK_KEEP_CHECKPOINTS``, else 1; 0 keeps all)."""

    def __init__(self, plan: Plan | None = None, stop: StopFlag | None = None, keep_checkpoints: int | None = None):
        install_exit_hook()  # an uncaught PlanError exits 2, reading the plan included
        self.plan = plan if plan is not None else Plan.from_env()
        #: Installed now: make the callback before anything slow.
        self.stop = stop if stop is not None else StopFlag(self.plan.stop_signal)
        #: This process's intra-op threads, from the plan unless the user set them
        #: (:mod:`rubick.threads`); before the slow imports, so torch starts with them.
        self.threads = _apply_threads(self.plan)
        if keep_checkpoints is not None and keep_checkpoints < 0:
            raise ValueError(f"keep_checkpoints={keep_checkpoints}: must be at least 0")
        #: Complete checkpoints kept after each save (0: all).
        self.keep_checkpoints = keep_checkpoints if keep_checkpoints is not None else checkpoints_to_keep()
        self.reporter = Reporter(self.plan)
        self._start: float | None = None
        self._optimizer: float | None = None
        self._pending: dict[str, Any] | None = None
        self.stopped = False

    def __getattr__(self, name: str) -> Callable[..., None]:
        # An event of a newer Transformers than this list knows: nothing to do.
        if name.startswith("on_"):
            return _nothing
        raise AttributeError(name)

    def _flush(self) -> None:
        if self._pending is not None:
            self.reporter.write(self._pending)
            self._pending = None

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._flush()
        self._start = time.perf_counter()

    def on_pre_optimizer_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._optimizer = time.perf_counter()

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        end = time.perf_counter()
        start = self._start if self._start is not None else end
        line: dict[str, Any] = {"iter": state.global_step, "iter_time_s": round(end - start, 6)}
        if self._optimizer is not None:
            line["backward_sync_s"] = round(self._optimizer - start, 6)
            line["optimizer_s"] = round(end - self._optimizer, 6)
        line["samples"] = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
        line["peak_memory_gib"] = round(peak_memory_gib(), 4)
        self._pending = line
        self._optimizer = None
        if self.stop.agreed():
            self.stopped = True
            control.should_save = True
            control.should_training_stop = True
            print(f"rubick: stop signal: saving after step {state.global_step}", file=sys.stderr)
        elif state.max_steps and state.global_step >= state.max_steps:
            control.should_save = True
        return control

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, float] | None = None,
        **kwargs: Any,
    ) -> None:
        if self._pending is not None and logs and "loss" in logs:
            self._pending["loss"] = float(logs["loss"])
            self._flush()

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        self._flush()
        if state.is_world_process_zero:
            path = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            with self.stop.held(), open(os.path.join(path, COMPLETE), "w") as f:
                f.write(f"{state.global_step} {self.plan.code()}\n")
                f.flush()
                os.fsync(f.fileno())
        self.reporter.event("checkpointed", iter=state.global_step)
        if state.is_world_process_zero:
            prune_checkpoints(args.output_dir, self.keep_checkpoints, written=path)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._flush()
        # The Trainer leaves its process group to the interpreter's teardown, where
        # gloo's threads can abort a rank after a clean end ("terminate called without
        # an active exception", -6: the run exits 1 after its last iteration): every
        # rank leaves it at exit instead, before that teardown.
        if not getattr(self, "_leaves", False):
            atexit.register(leave_process_group)
            self._leaves = True


def leave_process_group() -> None:
    """Destroys torch's default process group, if there is one (at exit: registered by
    the callback's ``on_train_end``; the script's own ``destroy_process_group`` before
    it is fine too)."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception as e:  # exiting anyway: say so, never raise at exit
        print(f"rubick.integrations.hf: leaving the process group at exit: {e}", file=sys.stderr)


def _nothing(*args: Any, **kwargs: Any) -> None:
    """An event this callback has nothing to do on."""


for _event in _EVENTS:
    if not hasattr(RubickCallback, _event):
        setattr(RubickCallback, _event, _nothing)
