"""A DeepSpeed engine loop, adopting rubick's job contract with the `rubick` package
(python/): the engine is built from the DeepSpeed JSON rubick wrote for the plan
(micro-batch, accumulation, ZeRO stage, optimizer offload), its activations
checkpointed when the plan says so, metric lines from rank 0, the stop signal
(checkpoint after the step, exit 0), resume at any data parallelism or ZeRO stage, OOM.

    deepspeed --num_gpus 2 examples/deepspeed/train.py --iterations 50

(DeepSpeed's own launcher; on a machine without GPUs it starts that many CPU workers.)
The lines marked `# rubick` are all the contract needed (28 of them, the phase timers
included).

What is saved is the full state (the module's weights, the same on every rank under
ZeRO 0-2, and the step), so a run resumes at another DP degree or ZeRO stage. The
optimizer is plain SGD, whose state is empty: an optimizer with state (Adam) under ZeRO
keeps it sharded across ranks, and resuming it at another degree takes DeepSpeed's
universal checkpoint (`ds_to_universal`), which this example leaves out.
"""

import argparse
import json
import os
import signal
import sys

try:  # rubick
    import rubick  # rubick
except ImportError:  # not installed: the package of this checkout
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))  # rubick
    import rubick  # rubick
rubick.install_exit_hook()  # rubick: an uncaught rubick.PlanError exits 2 (this plan cannot run)

# The stop signal is caught from here on, before the slow imports (a stop before would
# kill the worker). DeepSpeed's launcher ends its workers with SIGTERM when it is
# signalled: both stop.
stop = rubick.StopFlag(rubick.Plan.from_env().stop_signal, signal.SIGTERM)  # rubick

import deepspeed  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402


class Net(torch.nn.Module):
    """A small residual MLP: enough layers for activation checkpointing to mean something."""

    def __init__(self, width=64, layers=4, checkpointing=False):
        super().__init__()
        self.inp = torch.nn.Linear(32, width)
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU()) for _ in range(layers))
        self.out = torch.nn.Linear(width, 1)
        self.checkpointing = checkpointing

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            h = h + (checkpoint(block, h, use_reentrant=False) if self.checkpointing and self.training else block(h))
        return self.out(h)


def batch(seed, step, rank, rows, dtype):
    """Deterministic data: y = x @ w* + noise, the same for every plan."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1_009 + rank)
    x = torch.randn(rows, 32, generator=g)
    w = torch.linspace(-1, 1, 32)
    return x.to(dtype), (x @ w + 0.01 * torch.randn(rows, generator=g)).unsqueeze(1).to(dtype)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=int(os.environ.get("RUBICK_TOTAL_ITERATIONS", 50)))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--local_rank", type=int, default=0)  # DeepSpeed's launcher passes it
    args = parser.parse_args()

    with rubick.Run(stop=stop) as run:  # rubick
        plan = run.plan  # rubick
        deepspeed.init_distributed(dist_backend="gloo" if not torch.cuda.is_available() else None)
        world, rank = dist.get_world_size(), dist.get_rank()
        try:  # rubick
            plan.check_world(world)  # rubick: data parallelism and ZeRO here
        except rubick.PlanError as e:  # rubick
            print(e, file=sys.stderr)  # rubick
            sys.exit(2)  # rubick
        rubick.threads.apply(plan)  # rubick: its share of the cores, unless OMP_NUM_THREADS is set
        config = {"train_micro_batch_size_per_gpu": plan.micro_batch, "gradient_accumulation_steps": plan.ga}
        if plan.deepspeed_config:  # rubick: the plan's batch split, ZeRO stage, offload, bf16
            with open(plan.deepspeed_config) as f:  # rubick
                config = json.load(f)  # rubick
        # The script's own training settings (DeepSpeed clips gradients at norm 1 unless told).
        config.update(zero_allow_untested_optimizer=True, zero_force_ds_cpu_optimizer=False, gradient_clipping=0.0)
        if not torch.cuda.is_available():
            config["bf16"] = {"enabled": False}  # the CPU workers train in fp32
        torch.manual_seed(args.seed)
        model = Net(checkpointing=plan.gc)  # rubick: activation checkpointing as planned
        saved = run.resume()  # rubick
        if saved is not None:  # rubick
            model.load_state_dict(saved["model"])  # rubick
        optimizer = torch.optim.SGD(model.parameters(), lr=0.02)
        engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
        dtype = next(engine.module.parameters()).dtype
        state = lambda: {"model": {k: v.float() for k, v in engine.module.state_dict().items()}}  # noqa: E731  # rubick
        for it in run.iterations(total=args.iterations, state=state):  # rubick
            total = 0.0
            for micro in range(plan.ga):
                x, y = batch(args.seed, it.number * plan.ga + micro, rank, plan.micro_batch, dtype)  # rubick
                with it.phase("forward"):  # rubick
                    loss = torch.nn.functional.mse_loss(engine(x), y)
                with it.phase("backward_sync"):  # rubick
                    engine.backward(loss)
                with it.phase("optimizer"):  # rubick: the step happens at the last micro-step
                    engine.step()
                total += loss.item() / plan.ga
            it.loss = total  # rubick
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
