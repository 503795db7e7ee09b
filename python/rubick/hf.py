"""Hugging Face Transformers: the contract for a `Trainer` without rewriting its loop.

::

    import rubick.hf
    from transformers import Trainer

    args = rubick.hf.training_arguments(max_steps=1000, learning_rate=3e-4)   # the plan mapped
    trainer = Trainer(model=model, args=args, train_dataset=data,
                      callbacks=[rubick.hf.RubickCallback()])
    with rubick.exit_on_oom():
        trainer.train(resume_from_checkpoint=rubick.hf.last_checkpoint(args.output_dir))

What is mapped: micro-batch -> ``per_device_train_batch_size``, accumulation ->
``gradient_accumulation_steps``, checkpointing -> ``gradient_checkpointing``, ZeRO ->
the launcher's DeepSpeed JSON when DeepSpeed imports, else FSDP (ZeRO 2 ->
``shard_grad_op``, 3 -> ``full_shard``, offload -> ``offload``; ZeRO 1 has no FSDP
counterpart and runs as ``shard_grad_op``), the checkpoint directory ->
``output_dir`` (the Trainer's own checkpoints, resumed by the Trainer at the next
global step, at any data parallelism), ``RUBICK_TOTAL_ITERATIONS`` (else a profile's
``RUBICK_ITERATIONS``) -> ``max_steps``.
What cannot be: tensor and pipeline parallelism (the Trainer has no switch for them):
a plan with tp or pp > 1 is a :class:`~rubick.PlanError` (exit 2 for the launcher).

The callback writes one metric line per optimizer step (``iter`` is the Trainer's
global step; ``backward_sync_s`` is forward + backward + gradient sync, which the
Trainer does not separate; ``optimizer_s`` the step; ``loss`` when the Trainer logs
it, every step under this mapping), saves and stops after the step in progress on the
stop signal (the ``checkpointed`` event once the Trainer's checkpoint is complete),
and saves after the last step.
"""

from __future__ import annotations

import inspect
import os
import re
import sys
import time
from typing import Optional

from transformers import TrainerCallback, TrainingArguments

from .metrics import Reporter, peak_memory_gib
from .plan import Plan, PlanError
from .stop import StopFlag

#: Written into a Trainer checkpoint once it is complete (after the Trainer's save).
COMPLETE = "rubick-complete"


def training_arguments(plan: Optional[Plan] = None, **overrides) -> TrainingArguments:
    """``TrainingArguments`` for this run's plan; ``overrides`` (any of its fields) win,
    except the plan's own (batch, accumulation, checkpointing, sharding)."""
    plan = plan if plan is not None else Plan.from_env()
    if plan.tp > 1 or plan.pp > 1:
        raise PlanError(f"plan {plan.code()}: the Trainer has no tensor or pipeline parallelism (tp, pp must be 1)")
    import torch

    cpu = not torch.cuda.is_available()
    kwargs = dict(
        output_dir=plan.checkpoint_dir or overrides.pop("output_dir", "rubick-checkpoints"),
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
    # rubick-run: the job's iterations in all; rubick-profile: warm-up + measured.
    for var in ("RUBICK_TOTAL_ITERATIONS", "RUBICK_ITERATIONS"):
        total = os.environ.get(var, "").strip()
        if total.isdigit():
            overrides["max_steps"] = int(total)
            break
    kwargs.update(overrides)
    # Transformers 5 renamed `gradient_checkpointing` to `activation_checkpointing`.
    fields = inspect.signature(TrainingArguments.__init__).parameters
    checkpointing = "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"
    kwargs.update(per_device_train_batch_size=plan.micro_batch, gradient_accumulation_steps=plan.ga)
    kwargs[checkpointing] = plan.gc
    if plan.zero > 0:
        try:
            import deepspeed  # noqa: F401

            kwargs["deepspeed"] = plan.deepspeed_config
        except ImportError:
            mode = "full_shard" if plan.zero == 3 else "shard_grad_op"
            kwargs["fsdp"] = mode + (" offload" if plan.offload != "none" else "")
    return TrainingArguments(**kwargs)


def last_checkpoint(output_dir: Optional[str]) -> Optional[str]:
    """The newest complete Trainer checkpoint (``checkpoint-N`` holding the mark this
    callback writes after the Trainer's save) in ``output_dir``: a save killed half-way
    is never resumed from. ``None`` when there is none."""
    if not output_dir or not os.path.isdir(output_dir):
        return None
    found = []
    for name in os.listdir(output_dir):
        m = re.fullmatch(r"checkpoint-(\d+)", name)
        path = os.path.join(output_dir, name)
        if m and os.path.exists(os.path.join(path, COMPLETE)):
            found.append((int(m.group(1)), path))
    return max(found)[1] if found else None


class RubickCallback(TrainerCallback):
    """The contract for a `Trainer` (see the module's documentation)."""

    def __init__(self, plan: Optional[Plan] = None, stop: Optional[StopFlag] = None):
        self.plan = plan if plan is not None else Plan.from_env()
        #: Installed now: make the callback before anything slow.
        self.stop = stop if stop is not None else StopFlag(self.plan.stop_signal)
        self.reporter = Reporter(self.plan)
        self._start = self._optimizer = None
        self._pending: Optional[dict] = None
        self.stopped = False

    def _flush(self) -> None:
        if self._pending is not None:
            self.reporter.write(self._pending)
            self._pending = None

    def on_step_begin(self, args, state, control, **kwargs):
        self._flush()
        self._start = time.perf_counter()

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self._optimizer = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        end = time.perf_counter()
        start = self._start if self._start is not None else end
        line = {"iter": state.global_step, "iter_time_s": round(end - start, 6)}
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

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self._pending is not None and logs and "loss" in logs:
            self._pending["loss"] = float(logs["loss"])
            self._flush()

    def on_save(self, args, state, control, **kwargs):
        self._flush()
        if state.is_world_process_zero:
            path = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            with self.stop.held():
                with open(os.path.join(path, COMPLETE), "w") as f:
                    f.write(f"{state.global_step} {self.plan.code()}\n")
                    f.flush()
                    os.fsync(f.fileno())
        self.reporter.event("checkpointed", iter=state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        self._flush()
