"""A plain PyTorch DDP loop under torchrun, adopting rubick's job contract with the
`rubick` package (python/): the plan from the environment, metric lines, the stop
signal (checkpoint after the step, exit 0), resume at any data parallelism, OOM.

    python -m rubick.torchrun --standalone --nproc-per-node 2 train.py --iterations 50

(`rubick.torchrun`: torchrun that handles the stop signal and exits 0 after a clean
stop; plain torchrun needs --signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1
and exits 1 on every stop.)

The lines marked `# rubick` are all the contract needed (25 of them, the phase timers
included).
"""

import argparse
import os
import signal
import sys

try:  # rubick
    import rubick  # rubick
except ImportError:  # not installed: the package of this checkout
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))  # rubick
    import rubick  # rubick
rubick.install_exit_hook()  # rubick: an uncaught rubick.PlanError exits 2 (this plan cannot run)

# The stop signal is caught from here on, before the slow `import torch` (a stop before
# would kill the worker). torchrun relays it, then shuts its workers down with SIGTERM:
# both stop.
stop = rubick.StopFlag(rubick.Plan.from_env().stop_signal, signal.SIGTERM)  # rubick

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


def batch(seed, iteration, rank, rows):
    """Deterministic data: y = x @ w* + noise, the same for every plan."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + iteration * 1_009 + rank)
    x = torch.randn(rows, 32, generator=g)
    w = torch.arange(32, dtype=torch.float32) / 32
    return x, (x @ w).unsqueeze(1) + 0.01 * torch.randn(rows, 1, generator=g)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=int(os.environ.get("RUBICK_TOTAL_ITERATIONS", 50)))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    with rubick.Run(stop=stop) as run:  # rubick
        plan = run.plan  # rubick
        if "RANK" in os.environ:
            dist.init_process_group("gloo")
        world = dist.get_world_size() if dist.is_initialized() else 1
        rank = dist.get_rank() if dist.is_initialized() else 0
        try:  # rubick
            plan.check_world(world)  # rubick: only data parallelism here
        except rubick.PlanError as e:  # rubick
            print(e, file=sys.stderr)  # rubick
            sys.exit(2)  # rubick
        rubick.threads.apply(plan)  # rubick: its share of the cores, unless OMP_NUM_THREADS is set
        torch.manual_seed(args.seed)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        saved = run.resume()  # rubick
        if saved is not None:  # rubick
            model.load_state_dict(saved["model"])  # rubick
            optimizer.load_state_dict(saved["optimizer"])  # rubick
        ddp = DDP(model) if dist.is_initialized() else model
        state = lambda: {"model": model.state_dict(), "optimizer": optimizer.state_dict()}  # noqa: E731  # rubick
        for it in run.iterations(total=args.iterations, state=state):  # rubick
            total = 0.0
            for micro in range(plan.ga):
                x, y = batch(args.seed, it.number * plan.ga + micro, rank, plan.micro_batch)  # rubick
                sync = micro == plan.ga - 1 or not dist.is_initialized()
                with it.phase("forward"):  # rubick
                    loss = torch.nn.functional.mse_loss(ddp(x), y) / plan.ga
                with it.phase("backward_sync"):  # rubick
                    if sync:
                        loss.backward()
                    else:
                        with ddp.no_sync():
                            loss.backward()
                total += loss.item()
            with it.phase("optimizer"):  # rubick
                optimizer.step()
                optimizer.zero_grad()
            it.loss = total  # rubick
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
