"""PyTorch Lightning: the contract for a `Trainer` through a `Callback`.

::

    import rubick.integrations.lightning
    import lightning.pytorch as pl

    callback = rubick.integrations.lightning.RubickCallback()  # before anything slow
    plan = callback.plan
    loader = DataLoader(data, batch_size=plan.micro_batch)     # the plan's micro-batch
    trainer = pl.Trainer(callbacks=[callback], **rubick.integrations.lightning.trainer_kwargs(plan))
    with rubick.exit_on_oom():
        trainer.fit(model, loader, ckpt_path=rubick.integrations.lightning.last_checkpoint(plan))

What is mapped: data parallelism -> ``devices`` per node and ``num_nodes`` with the
``ddp`` strategy, accumulation -> ``accumulate_grad_batches``, ZeRO -> DeepSpeed's
``deepspeed_stage_N`` (``_offload`` with offload) when DeepSpeed imports, else FSDP
(ZeRO 3: full sharding, 1 and 2: ``SHARD_GRAD_OP``), ``RUBICK_TOTAL_ITERATIONS``
(else a profile's ``RUBICK_ITERATIONS``; a positive integer, else a
:class:`~rubick.PlanError`) -> ``max_steps``. What is not the
Trainer's to map: the micro-batch (the script's ``DataLoader``: ``plan.micro_batch``)
and activation checkpointing (the model's: ``plan.gc``). What cannot be: tensor and
pipeline parallelism (a :class:`~rubick.PlanError`).

The callback writes one metric line per optimizer step (``iter``: the Trainer's
``global_step``; ``forward_s``, ``backward_sync_s`` and ``optimizer_s`` summed over
the accumulation's micro-batches; ``loss``: their mean), and on the stop signal saves
the Trainer's checkpoint atomically after the step in progress and stops the Trainer;
the last step saves too. Lightning resumes ``global_step``, optimizer and loops from it.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

try:
    import lightning.pytorch as pl
except ImportError:  # the older package name
    import pytorch_lightning as pl

from .. import ranks as _rank
from ..metrics import Reporter, peak_memory_gib
from ..plan import Plan, PlanError, install_exit_hook, total_iterations
from ..stop import StopFlag
from ..threads import apply as _apply_threads

#: The checkpoint's file name in the checkpoint directory.
FILE = "last.ckpt"


def trainer_kwargs(plan: Plan | None = None, **overrides: Any) -> dict[str, Any]:
    """Keyword arguments of ``pl.Trainer`` for this run's plan; ``overrides`` win."""
    plan = plan if plan is not None else Plan.from_env()
    if plan.tp > 1 or plan.pp > 1:
        raise PlanError(f"plan {plan.code()}: Lightning's Trainer has no tensor or pipeline parallelism here")
    import torch

    kw: dict[str, Any] = dict(
        accelerator="gpu" if torch.cuda.is_available() else "cpu",
        devices=max(1, plan.dp // max(1, plan.nodes)),
        num_nodes=plan.nodes,
        accumulate_grad_batches=plan.ga,
        enable_progress_bar=False,
        enable_checkpointing=False,  # the callback saves
        enable_model_summary=False,
        logger=False,
        log_every_n_steps=1,
    )
    if plan.zero > 0:
        try:
            import deepspeed  # noqa: F401

            offload = "_offload" if plan.offload != "none" and plan.zero >= 2 else ""
            kw["strategy"] = f"deepspeed_stage_{plan.zero}{offload}"
        except ImportError:
            from lightning.pytorch.strategies import FSDPStrategy

            sharding = "FULL_SHARD" if plan.zero == 3 else "SHARD_GRAD_OP"
            kw["strategy"] = FSDPStrategy(sharding_strategy=sharding, cpu_offload=plan.offload != "none")
    elif plan.dp > 1:
        kw["strategy"] = "ddp"
    total = total_iterations()  # a count that is not a positive integer: PlanError
    if total is not None:
        kw["max_steps"] = total[1]
    kw.update(overrides)
    return kw


def last_checkpoint(plan: Plan | None = None) -> str | None:
    """The checkpoint to resume from (``ckpt_path`` of ``fit``), ``None`` when there is
    none (a save killed half-way left only a temporary file, which is ignored)."""
    plan = plan if plan is not None else Plan.from_env()
    if not plan.checkpoint_dir:
        return None
    path = os.path.join(plan.checkpoint_dir, FILE)
    return path if os.path.exists(path) else None


class RubickCallback(pl.Callback):  # type: ignore[misc]  # Lightning is checked as Any
    """The contract for a Lightning `Trainer` (see the module's documentation)."""

    def __init__(self, plan: Plan | None = None, stop: StopFlag | None = None):
        install_exit_hook()  # an uncaught PlanError exits 2, reading the plan included
        self.plan = plan if plan is not None else Plan.from_env()
        #: Installed now: make the callback before anything slow.
        self.stop = stop if stop is not None else StopFlag(self.plan.stop_signal)
        #: This process's intra-op threads, from the plan unless the user set them
        #: (:mod:`rubick.threads`).
        self.threads = _apply_threads(self.plan)
        self.reporter = Reporter(self.plan)
        self._step_start: float | None = None
        self._mark = 0.0
        self._phases = {"forward": 0.0, "backward_sync": 0.0, "optimizer": 0.0}
        self._losses: list[float] = []
        self._samples = 0
        self._last_step: int | None = None
        self.stopped = False

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        now = time.perf_counter()
        if self._last_step is None:
            self._last_step = trainer.global_step
        if self._step_start is None:
            self._step_start = now
        self._mark = now

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: Any) -> None:
        now = time.perf_counter()
        self._phases["forward"] += now - self._mark
        self._mark = now

    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        now = time.perf_counter()
        self._phases["backward_sync"] += now - self._mark
        self._mark = now

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        self._mark = time.perf_counter()

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None:
            self._losses.append(float(loss.detach()) if hasattr(loss, "detach") else float(loss))
        self._samples += _batch_size(batch)
        if trainer.global_step == self._last_step:
            return  # accumulating: no optimizer step yet
        end = time.perf_counter()
        self._phases["optimizer"] += end - self._mark
        line: dict[str, Any] = {"iter": trainer.global_step, "iter_time_s": round(end - (self._step_start or end), 6)}
        line.update({f"{k}_s": round(v, 6) for k, v in self._phases.items()})
        line["samples"] = self._samples * trainer.world_size
        line["peak_memory_gib"] = round(peak_memory_gib(), 4)
        if self._losses:
            line["loss"] = sum(self._losses) / len(self._losses)
        self.reporter.write(line)
        self._step_start, self._last_step, self._samples, self._losses = None, trainer.global_step, 0, []
        self._phases = dict.fromkeys(self._phases, 0.0)
        if self.stop.agreed():
            self.stopped = True
            print(f"rubick: stop signal: saving after step {trainer.global_step}", file=sys.stderr)
            self.save(trainer)
            trainer.should_stop = True
        elif trainer.max_steps and trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps:
            self.save(trainer)

    def save(self, trainer: pl.Trainer) -> None:
        """The Trainer's checkpoint, atomically (every rank calls it: it is collective),
        then the ``checkpointed`` event."""
        if not self.plan.checkpoint_dir:
            return
        final = os.path.join(self.plan.checkpoint_dir, FILE)
        tmp = final + ".tmp"
        with self.stop.held():
            trainer.save_checkpoint(tmp)
            if _rank.is_main():
                with open(tmp, "rb") as f:
                    os.fsync(f.fileno())
                os.replace(tmp, final)
                fd = os.open(self.plan.checkpoint_dir, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        self.reporter.event("checkpointed", iter=trainer.global_step)


def _batch_size(batch: Any) -> int:
    """Samples in a batch: the first dimension of its first tensor."""
    if hasattr(batch, "shape"):
        return int(batch.shape[0])
    if isinstance(batch, (list, tuple)) and batch:
        return _batch_size(batch[0])
    if isinstance(batch, dict) and batch:
        return _batch_size(next(iter(batch.values())))
    return 0
