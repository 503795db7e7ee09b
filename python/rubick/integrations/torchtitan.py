"""torchtitan under rubick's contract: a plan as torchtitan's flags, and its trainer run
with the contract's stop, resume and metric lines.

::

    python -m rubick.torchrun --standalone --nproc-per-node={gpus} \\
        -m rubick.integrations.torchtitan --module llama3 --config llama3_debugmodel

runs ``torchtitan.train`` (torchtitan 0.3.0, the Python registry's) with the job's own
arguments followed by the plan's (:func:`command`). What rubick adds:

* **The plan as flags** (:func:`flags`), from torchtitan 0.3.0's configuration
  (``torchtitan/config/configs.py``, ``torchtitan/trainer.py``):
  ``--parallelism.data_parallel_replicate_degree`` (DDP) or ``..._shard_degree``
  (FSDP2) with ``--parallelism.fsdp_reshard_after_forward`` (``always``: ZeRO-3,
  ``never``: ZeRO-2), ``--parallelism.tensor_parallel_degree`` with
  ``--parallelism.[no_]enable_sequence_parallel``, ``--parallelism.pipeline_parallel_*``
  (``1F1B``, or ``Interleaved1F1B`` with the plan's virtual stages: layers per stage
  = layers / (pp x vp)), ``--training.enable_cpu_offload`` (FSDP2 offloads parameters,
  gradients and optimizer states), the batch as ``--training.local_batch_size`` (per
  data-parallel rank and step; with a pipeline all its micro-batches) and
  ``--training.global_batch_size`` (torchtitan accumulates global / (local x DP)
  steps), and activation checkpointing as the subcommand ``activation-checkpoint:none``,
  ``:selective`` or ``:full``, which must be the last argument (a tyro subcommand).
  torchtitan's selective recompute is per operator (it saves the matmuls' and
  attention's outputs and recomputes every second matmul and the rest), close to but
  not the attention core alone that rubick's model prices.
* **What it cannot run is refused by name** (:class:`Unsupported`, exit 2): ZeRO 1
  (FSDP2 shards gradients with the optimizer states), optimizer-only offload, pp x vp
  not dividing the layers. :data:`SUPPORTS` is the job's ``launch.supports`` that keeps
  the planner inside what maps. ZeRO 2 or 3 on one data-parallel rank shards nothing
  (FSDP2 of degree 1); its offload still applies. With a pipeline, CUDA graphs (which
  torchtitan 0.3 captures each step in) are turned off: no schedule supports them yet.
* **Checkpoints** (:func:`checkpoint_flags`) in ``$RUBICK_CHECKPOINT_DIR/torchtitan``:
  torchtitan's own DCP checkpoints (``step-N/``, valid once DCP wrote ``.metadata``),
  every save resumable (``--checkpoint.no_last_save_model_only``), saved synchronously.
  DCP reshards the model, optimizer and schedule to any layout, but torchtitan's data
  loader refuses a changed data-parallel degree, so when the newest checkpoint was saved
  at another one (``rubick-torchtitan.json`` records each save's degree) it is left out
  of loading (``--checkpoint.exclude_from_loading=dataloader``): the data loader's
  position restarts; the step and everything else resume. A malformed record counts as
  absent (a warning on stderr; the degree unrecorded) and is replaced, atomically, at
  the next save.
* **The contract at run time** (:func:`main`): the stop signal (installed before torch
  is imported) is checked between steps and agreed by all ranks; on it the trainer
  saves a full checkpoint at the step it finished (unless its own interval just did),
  writes the ``checkpointed`` event with ``save_s`` and returns, and the run exits 0.
  Each step writes a metric line from rank 0 (its time, the global batch, peak memory,
  the loss when rank 0 holds it: with a pipeline the last stage does). ``--training.steps``
  is the job's iterations (``RUBICK_TOTAL_ITERATIONS``, else ``RUBICK_ITERATIONS``);
  out of memory is the ``oom`` event and exit 3.

torchtitan needs GPUs (it runs no CPU-only training: pytorch/torchtitan#1661);
``scripts/torchtitan-gpu.sh`` profiles and reconfigures its llama3 debug model on one.
The tests run its trainer on CPU with its device type set to ``cpu`` around it
(``python/tests/titan_cpu.py``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

from .. import checkpoint as _checkpoint
from .. import ranks as _rank
from ..metrics import Reporter, peak_memory_gib
from ..plan import Plan, PlanError, install_exit_hook, total_iterations
from ..stop import StopFlag
from ..threads import apply as _apply_threads

#: ``launch.supports`` of a torchtitan job: what :func:`flags` can map.
SUPPORTS = {
    "zero": [0, 2, 3],
    "offload": ["none", "all"],
    "sequenceParallel": True,
    "selectiveRecompute": True,
    "maxVp": 8,
}

#: The checkpoint folder's name in ``RUBICK_CHECKPOINT_DIR``.
FOLDER = "torchtitan"

#: The record of each save's data-parallel degree, in ``RUBICK_CHECKPOINT_DIR``.
RECORD = "rubick-torchtitan.json"

#: Options the plan sets; a job's own arguments must leave them out.
PLANNED = (
    "--parallelism.data_parallel_replicate_degree",
    "--parallelism.data_parallel_shard_degree",
    "--parallelism.fsdp_reshard_after_forward",
    "--parallelism.tensor_parallel_degree",
    "--parallelism.enable_sequence_parallel",
    "--parallelism.no_enable_sequence_parallel",
    "--parallelism.pipeline_parallel_",
    "--training.local_batch_size",
    "--training.global_batch_size",
    "--training.enable_cpu_offload",
    "--training.no_enable_cpu_offload",
    "--training.steps",
    "--checkpoint.",
    "activation-checkpoint:",
    "--activation_checkpoint.",
)


class Unsupported(PlanError):
    """A plan (or a part of one) torchtitan cannot run; the message says which. Uncaught,
    it exits 2 (the contract's "this plan cannot run here")."""


def flags(plan: Plan, layers: int) -> list[str]:
    """torchtitan's options for ``plan`` on a model of ``layers`` transformer layers
    (activation checkpointing is :func:`recompute`, which goes last)."""
    if plan.zero == 1:
        raise Unsupported(f"{plan.code()}: ZeRO 1 (torchtitan's FSDP2 shards the gradients too)")
    if plan.offload == "optimizer":
        raise Unsupported(f"{plan.code()}: optimizer-only offload (torchtitan offloads everything or nothing)")
    if plan.pp > 1 and layers % (plan.pp * plan.vp):
        raise Unsupported(f"{plan.code()}: pp x vp = {plan.pp * plan.vp} does not divide the {layers} layers")
    # FSDP2 when the plan shards (ZeRO 2/3) or offloads; on one data-parallel rank there
    # is nothing to shard, but torchtitan always wraps with FSDP2 (degree 1), so the
    # offload still applies.
    sharded = plan.zero >= 2 or plan.offload != "none"
    out = [
        f"--parallelism.data_parallel_replicate_degree={1 if sharded else plan.dp}",
        f"--parallelism.data_parallel_shard_degree={plan.dp if sharded else 1}",
        f"--parallelism.tensor_parallel_degree={plan.tp}",
        "--parallelism.enable_sequence_parallel" if plan.sp else "--parallelism.no_enable_sequence_parallel",
        f"--parallelism.pipeline_parallel_degree={plan.pp}",
        # torchtitan accumulates global / (local x data-parallel degree) steps; with a
        # pipeline the local batch is split into micro-batches instead.
        f"--training.local_batch_size={plan.micro_batch * plan.ga if plan.pp > 1 else plan.micro_batch}",
        f"--training.global_batch_size={plan.global_batch}",
    ]
    if sharded:
        out.append(f"--parallelism.fsdp_reshard_after_forward={'always' if plan.zero == 3 else 'never'}")
    out.append("--training.enable_cpu_offload" if plan.offload == "all" else "--training.no_enable_cpu_offload")
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
            # torchtitan 0.3 captures each step in a CUDA graph, which no pipeline
            # schedule supports yet: its config refuses the pair.
            "--training.disable_cuda_graphs",
        ]
    return out


def recompute(plan: Plan) -> str:
    """torchtitan's activation-checkpointing subcommand for ``plan`` (the last argument)."""
    return f"activation-checkpoint:{plan.recompute}"


def checkpoint_flags(folder: str, exclude_data_loader: bool) -> list[str]:
    """Checkpoints in ``folder`` (absolute), saved synchronously, every save a full,
    resumable one (torchtitan's default final save holds the model only); the data
    loader left out of loading when ``exclude_data_loader`` (a changed data-parallel
    degree)."""
    out = [
        "--checkpoint.enable",
        f"--checkpoint.folder={folder}",
        "--checkpoint.no_last_save_model_only",
        "--checkpoint.async_mode=disabled",
    ]
    if exclude_data_loader:
        out.append("--checkpoint.exclude_from_loading=dataloader")
    return out


def check_own(args: Sequence[str]) -> None:
    """Raises :class:`Unsupported` when a job's own arguments set what the plan sets."""
    for a in args:
        for p in PLANNED:
            if a.startswith(p):
                raise Unsupported(
                    f"the job's torchtitan arguments set {a.split('=')[0]!r}: the plan sets it; leave it out"
                )


def dump_folder(plan: Plan) -> str | None:
    """Where torchtitan's own outputs (its structured logs, traces) go: ``torchtitan/``
    in the run's directory, the one of ``RUBICK_METRICS`` (torchtitan's default is
    ``./outputs`` in whatever directory the run starts in: the clone's root). ``None``
    when the metric lines go to stdout."""
    if plan.metrics is None:
        return None
    return os.path.join(os.path.dirname(os.path.abspath(plan.metrics)), FOLDER)


def command(
    plan: Plan,
    layers: int,
    own: Sequence[str],
    folder: str | None,
    exclude_data_loader: bool,
    steps: int | None,
    dump: str | None = None,
) -> list[str]:
    """torchtitan's arguments for ``plan``: the job's own (``own``: the model, its
    configuration, anything the plan does not set), the plan's, ``--training.steps``,
    a metric line per step, the checkpoint's (none when ``folder`` is ``None``),
    ``--dump_folder=dump`` unless the job's own arguments name one, and the
    activation-checkpointing subcommand last."""
    check_own(own)
    out = [*own, *flags(plan, layers), "--metrics.log_freq=1"]
    if dump is not None and not any(a.split("=")[0] in ("--dump_folder", "--job.dump_folder") for a in own):
        out.append(f"--dump_folder={dump}")
    if steps is not None:
        out.append(f"--training.steps={steps}")
    if folder is not None:
        out += checkpoint_flags(folder, exclude_data_loader)
    out.append(recompute(plan))
    return out


def _valid_steps(folder: str) -> list[int]:
    """The steps of ``folder``'s complete checkpoints, as torchtitan finds them."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    return sorted(
        int(m.group(1))
        for n in names
        if (m := re.fullmatch(r"step-(\d+)", n)) and os.path.isfile(os.path.join(folder, n, ".metadata"))
    )


def _read_record(checkpoint_dir: str) -> dict[str, int]:
    """The record's entries (step -> data-parallel degree); none when there is no
    record. A malformed one (not JSON, not ``{"dp": {"<step>": <degree>, ...}}``) counts
    as absent, with a warning on stderr: the next :func:`record_save` replaces it."""
    path = os.path.join(checkpoint_dir, RECORD)
    try:
        with open(path, "rb") as f:
            saved = json.loads(f.read())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:  # unreadable, not UTF-8, not JSON
        return _malformed(path, str(e))
    entries = saved.get("dp") if isinstance(saved, dict) else None
    if not isinstance(entries, dict):
        return _malformed(path, 'expected {"dp": {"<step>": <degree>, ...}}')
    for k, v in entries.items():
        if not re.fullmatch(r"[0-9]+", k) or type(v) is not int or v < 1:
            return _malformed(path, f"entry {k!r}: {v!r} is not a step and its data-parallel degree")
    return {str(int(k)): v for k, v in entries.items()}


def _malformed(path: str, why: str) -> dict[str, int]:
    if _rank.is_main():
        print(
            f"rubick: warning: {path}: malformed ({why}); treated as absent (the next save rewrites it)",
            file=sys.stderr,
            flush=True,
        )
    return {}


def saved_dp(checkpoint_dir: str) -> tuple[int, int | None] | None:
    """The newest complete checkpoint in ``checkpoint_dir``: its step and the
    data-parallel degree it was saved at (``None``: not recorded); ``None`` when there
    is none."""
    steps = _valid_steps(os.path.join(checkpoint_dir, FOLDER))
    if not steps:
        return None
    return steps[-1], _read_record(checkpoint_dir).get(str(steps[-1]))


def record_save(checkpoint_dir: str, step: int, dp: int) -> None:
    """Records (atomically) that the save of ``step`` is at data-parallel degree ``dp``:
    written before the save starts, so a complete checkpoint always has its entry.
    Entries of steps whose checkpoints are gone are dropped."""
    keep = set(_valid_steps(os.path.join(checkpoint_dir, FOLDER)))
    saved = {k: v for k, v in _read_record(checkpoint_dir).items() if int(k) in keep}
    saved[str(step)] = dp
    body = json.dumps({"dp": saved}, sort_keys=True).encode()
    _checkpoint.write_atomic(os.path.join(checkpoint_dir, RECORD), lambda f: _checkpoint._write_all(f, body))


def _synchronize() -> None:
    torch: Any = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class Hooks:
    """The contract wrapped around torchtitan's ``Trainer`` (its ``train_step``,
    ``should_continue_training`` and checkpointer's ``save``) and ``MetricsProcessor.log``
    (the loss): see the module's description. :meth:`install` patches the classes."""

    def __init__(self, plan: Plan, stop: StopFlag):
        self.plan = plan
        self.stop = stop
        self.reporter = Reporter(plan)
        self.step_s: float | None = None
        self.loss: float | None = None
        #: Set once the run stopped on the signal.
        self.stopped = False
        self._saved_at: int | None = None

    def install(self, trainer: Any, metrics: Any) -> None:
        hooks = self
        train_step, should_continue, log = trainer.train_step, trainer.should_continue_training, metrics.log

        def timed_train_step(self: Any, *args: Any, **kwargs: Any) -> Any:
            _synchronize()
            start = time.perf_counter()
            out = train_step(self, *args, **kwargs)
            _synchronize()
            hooks.step_s = time.perf_counter() - start
            return out

        def logged(self: Any, step: int, global_avg_loss: float, *args: Any, **kwargs: Any) -> Any:
            hooks.loss = float(global_avg_loss)
            return log(self, step, global_avg_loss, *args, **kwargs)

        def continues(self: Any) -> bool:
            return hooks.between_steps(self, lambda: bool(should_continue(self)))

        trainer.train_step = timed_train_step
        trainer.should_continue_training = continues
        metrics.log = logged

    def _wrap_save(self, trainer: Any) -> None:
        checkpointer = trainer.checkpointer
        if getattr(checkpointer, "_rubick", False) or not getattr(checkpointer, "enable", False):
            return
        save = checkpointer.save
        hooks = self

        def timed_save(curr_step: int, last_step: bool = False) -> Any:
            hooks._write_step(curr_step)
            decide = getattr(checkpointer, "_should_save", None)
            will = decide(curr_step, last_step) if decide is not None else True
            directory = hooks.plan.checkpoint_dir
            if will and directory is not None and _rank.is_main():
                record_save(directory, curr_step, hooks.plan.dp)
            start = time.perf_counter()
            with hooks.stop.held():
                out = save(curr_step, last_step=last_step)
            # torchtitan 0.3's save says whether it saved.
            if out if isinstance(out, bool) else will:
                hooks._saved_at = curr_step
                hooks.reporter.event(
                    "checkpointed", iter=curr_step, save_s=round(time.perf_counter() - start, 6), format="sharded"
                )
            return out

        checkpointer.save = timed_save
        checkpointer._rubick = True

    def _write_step(self, step: int) -> None:
        """The metric line of the step that just ran, once (before its save's event)."""
        if self.step_s is None:
            return
        line: dict[str, Any] = {
            "iter": step,
            "iter_time_s": round(self.step_s, 6),
            "samples": self.plan.global_batch,
            "peak_memory_gib": round(peak_memory_gib(), 4),
        }
        # With a pipeline, rank 0 (the first stage) holds no loss (torchtitan's -1).
        if self.loss is not None and not (self.plan.pp > 1 and self.loss < 0):
            line["loss"] = self.loss
        self.reporter.write(line)
        self.step_s = self.loss = None

    def between_steps(self, trainer: Any, should_continue: Any) -> bool:
        """Called before each step: the finished step's metric line, then whether to go
        on (torchtitan's own answer, unless every rank agreed to stop: then the finished
        step is saved and the answer is no)."""
        self._wrap_save(trainer)
        step = int(trainer.step)
        self._write_step(step)
        if not should_continue():
            return False
        if not self.stop.agreed():
            return True
        self.stopped = True
        if self._saved_at != step and self.plan.checkpoint_dir is not None:
            trainer.checkpointer.save(step, last_step=True)
        print(f"rubick: stopped after step {step}", file=sys.stderr)
        return False


#: Where scripts/python-env.sh installs torchtitan: a layer of its own in the venv (its
#: dependencies would downgrade what other adapters need).
LAYER = "torchtitan-0.3.0"


def importable() -> None:
    """Makes ``import torchtitan`` work: as installed, else from the venv's layer
    (appended to ``sys.path``, so the venv's own packages win where both have one).
    Raises ``ImportError`` saying where it looked."""
    import importlib.util

    if importlib.util.find_spec("torchtitan") is not None:
        return
    layer = os.path.join(sys.prefix, LAYER)
    if not os.path.isdir(layer):
        raise ImportError(f"torchtitan is not installed, nor in {layer} (scripts/python-env.sh installs it there)")
    sys.path.append(layer)


def _model_layers(own: Sequence[str]) -> int:
    """The transformer layers of the model the job's own arguments configure (parsed
    by torchtitan's ``ConfigManager``)."""
    from torchtitan.config import ConfigManager  # type: ignore[import-not-found]

    config: Any = ConfigManager().parse_args(list(own))
    return len(config.model_spec.model.layers)


def _steps() -> int | None:
    total = total_iterations()  # a count that is not a positive integer: PlanError
    return total[1] if total is not None else None


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m rubick.integrations.torchtitan <the job's torchtitan arguments>``: one worker."""
    install_exit_hook()  # a refused plan exits 2
    plan = Plan.from_env()
    stop = StopFlag(plan.stop_signal, signal.SIGTERM)
    _apply_threads(plan)  # this worker's intra-op threads, unless the user set them
    own = list(sys.argv[1:] if argv is None else argv)
    from ..oom import exit_on_oom

    with exit_on_oom(plan.metrics):
        check_own(own)
        importable()
        layers = _model_layers(own)
        folder = exclude = None
        if plan.checkpoint_dir is not None:
            folder = os.path.join(os.path.abspath(plan.checkpoint_dir), FOLDER)
            newest = saved_dp(plan.checkpoint_dir)
            exclude = newest is not None and newest[1] != plan.dp
            if newest is not None and _rank.is_main():
                was = "an unrecorded degree" if newest[1] is None else f"dp{newest[1]}"
                extra = "; the data loader starts over" if exclude else ""
                print(
                    f"rubick: resuming from step {newest[0]} (saved at {was}, now {plan.code()}){extra}",
                    file=sys.stderr,
                )
        args = command(plan, layers, own, folder, bool(exclude), _steps(), dump_folder(plan))
        from torchtitan import train  # type: ignore[import-not-found]
        from torchtitan.components.metrics import MetricsProcessor  # type: ignore[import-not-found]
        from torchtitan.trainer import Trainer  # type: ignore[import-not-found]

        hooks = Hooks(plan, stop)
        hooks.install(Trainer, MetricsProcessor)
        sys.argv = ["torchtitan.train", *args]
        train.main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
