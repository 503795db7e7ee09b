"""A rubick plan as torchtitan's command-line flags.

torchtitan (PyTorch's own training platform) takes its parallelism from flags of its
``JobConfig`` (``torchtitan/config/job_config.py``, pytorch/torchtitan@000204a):
``--parallelism.data_parallel_replicate_degree`` (DDP) and ``..._shard_degree``
(FSDP2), ``--parallelism.fsdp_reshard_after_forward`` (``always``: ZeRO-3, ``never``:
ZeRO-2), ``--parallelism.tensor_parallel_degree`` (its TP always shards the sequence
between the TP ranks: sequence parallelism), ``--parallelism.pipeline_parallel_degree``
with ``..._schedule``, ``..._layers_per_stage`` and ``..._microbatch_size``,
``--training.enable_cpu_offload`` (FSDP2 offload of parameters, gradients and optimizer
states), ``--activation_checkpoint.mode`` (``none``, ``selective``, ``full``) and the
batch as ``--training.local_batch_size`` (per data-parallel rank and step; with a
pipeline, all its micro-batches) and
``--training.global_batch_size`` (torchtitan accumulates global / (local x DP) steps).

:func:`flags` maps a :class:`~rubick.plan.Plan` to them, or raises :class:`Unsupported`
naming what torchtitan cannot run: ZeRO 1 (FSDP2 shards parameters and gradients with
the optimizer states), optimizer-only offload, tensor parallelism without sequence
parallelism, ZeRO with a data-parallel degree of 1. Its selective recompute is per-op
(``selective_ac_option op``: matmuls saved, the rest recomputed), close to but not the
attention core alone that rubick's model prices. :data:`SUPPORTS` is the job's
``launch.supports`` that keeps the planner inside what maps.

:func:`checkpoint_flags` makes every save resumable and a resume at another
data-parallel degree possible: torchtitan's checkpoint (DCP) reshards the model,
optimizer and schedule to any layout, but its data loader refuses a changed DP degree,
so it is excluded from loading then (its position restarts; the step counter does not).
"""

from __future__ import annotations

from collections.abc import Sequence

from .plan import Plan

#: ``launch.supports`` of a torchtitan job: what :func:`flags` can map.
SUPPORTS = {
    "zero": [0, 2, 3],
    "offload": ["none", "all"],
    "sequenceParallel": True,
    "selectiveRecompute": True,
    "maxVp": 8,
}


class Unsupported(ValueError):
    """A plan (or a part of one) torchtitan cannot run; the message says which."""


def flags(plan: Plan, layers: int) -> list[str]:
    """torchtitan's flags for ``plan`` on a model of ``layers`` transformer layers."""
    if plan.zero == 1:
        raise Unsupported(f"{plan.code()}: ZeRO 1 (torchtitan's FSDP2 shards parameters and gradients too)")
    if plan.zero >= 2 and plan.dp == 1 and plan.offload == "none":
        raise Unsupported(f"{plan.code()}: ZeRO {plan.zero} on one data-parallel rank shards nothing")
    if plan.offload == "optimizer":
        raise Unsupported(f"{plan.code()}: optimizer-only offload (torchtitan offloads everything or nothing)")
    if plan.offload == "all" and plan.zero != 3:
        raise Unsupported(f"{plan.code()}: offload needs ZeRO 3")
    if plan.tp > 1 and not plan.sp:
        raise Unsupported(f"{plan.code()}: tensor parallelism without sequence parallelism (torchtitan's TP has it)")
    if plan.pp > 1 and layers % (plan.pp * plan.vp):
        raise Unsupported(f"{plan.code()}: pp*vp = {plan.pp * plan.vp} does not divide the {layers} layers")
    sharded = plan.zero >= 2 or plan.offload != "none"
    out = [
        f"--parallelism.data_parallel_replicate_degree={1 if sharded else plan.dp}",
        f"--parallelism.data_parallel_shard_degree={plan.dp if sharded else 1}",
        f"--parallelism.tensor_parallel_degree={plan.tp}",
        f"--parallelism.pipeline_parallel_degree={plan.pp}",
        # torchtitan accumulates global / (local x data-parallel degree) steps; with a
        # pipeline the local batch is split into micro-batches instead.
        f"--training.local_batch_size={plan.micro_batch * plan.ga if plan.pp > 1 else plan.micro_batch}",
        f"--training.global_batch_size={plan.global_batch}",
        f"--activation_checkpoint.mode={plan.recompute}",
    ]
    if sharded:
        out.append(f"--parallelism.fsdp_reshard_after_forward={'always' if plan.zero == 3 else 'never'}")
    if plan.offload == "all":
        out.append("--training.enable_cpu_offload")
    if plan.recompute == "selective":
        out.append("--activation_checkpoint.selective_ac_option=op")
    if plan.pp > 1:
        schedule = "Interleaved1F1B" if plan.vp > 1 else "1F1B"
        out += [
            f"--parallelism.pipeline_parallel_schedule={schedule}",
            f"--parallelism.pipeline_parallel_microbatch_size={plan.micro_batch}",
            f"--parallelism.pipeline_parallel_layers_per_stage={layers // (plan.pp * plan.vp)}",
            # Even stages, as rubick's model splits them (torchtitan's default gives the
            # embedding and the output a layer's weight each).
            "--parallelism.pipeline_parallel_first_stage_less_layers=0",
            "--parallelism.pipeline_parallel_last_stage_less_layers=0",
        ]
    return out


def checkpoint_flags(folder: str, saved_dp: int | None, plan: Plan) -> list[str]:
    """Checkpoint flags of a run under rubick: checkpoints in ``folder``, every save a
    full, resumable one (``last_save_model_only`` off), and the data loader excluded
    from loading when the checkpoint was saved at another data-parallel degree
    (``saved_dp``; ``None`` when there is none yet)."""
    out = ["--checkpoint.enable_checkpoint", f"--checkpoint.folder={folder}", "--checkpoint.no_last_save_model_only"]
    if saved_dp is not None and saved_dp != plan.dp:
        out.append("--checkpoint.exclude_from_loading=dataloader")
    return out


def command(plan: Plan, layers: int, config: str, folder: str, saved_dp: int | None) -> Sequence[str]:
    """The arguments after ``torchtitan.train`` for ``plan``: its job config file, the
    plan's flags and the checkpoint's."""
    return [f"--job.config_file={config}", *flags(plan, layers), *checkpoint_flags(folder, saved_dp, plan)]
