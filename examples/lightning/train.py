"""A PyTorch Lightning script adopting rubick's job contract with `rubick.integrations.lightning`: a
small regression model on deterministic synthetic data, trained by Lightning's own
Trainer (DDP across the processes torchrun starts, accumulation from the plan).

    python -m rubick.torchrun --standalone --nproc-per-node 2 train.py

(`rubick.torchrun`: torchrun that handles the stop signal and exits 0 after a clean
stop; plain torchrun needs --signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1
and exits 1 on every stop.)

The lines marked `# rubick` are all the contract needed (19 of them).
"""

import os
import signal
import sys

try:  # rubick
    import rubick  # rubick
except ImportError:  # not installed: the package of this checkout
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))  # rubick
    import rubick  # rubick
rubick.install_exit_hook()  # rubick: an uncaught rubick.PlanError exits 2 (this plan cannot run)

# Before the slow imports (rubick.integrations.lightning imports Lightning): torchrun relays the stop
# signal, then shuts down with SIGTERM.
stop = rubick.StopFlag(rubick.Plan.from_env().stop_signal, signal.SIGTERM)  # rubick
import rubick.integrations.lightning  # noqa: E402  # rubick
callback = rubick.integrations.lightning.RubickCallback(stop=stop)  # rubick

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402


class Regression(pl.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

    def training_step(self, batch, _):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(200_000, 16, generator=g)
    y = (x @ (torch.arange(16.0) / 16)).unsqueeze(1) + 0.01 * torch.randn(200_000, 1, generator=g)
    plan = callback.plan  # rubick
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=plan.micro_batch)  # rubick
    try:  # rubick
        kwargs = rubick.integrations.lightning.trainer_kwargs(plan)  # rubick
    except rubick.PlanError as e:  # rubick
        print(e, file=sys.stderr)  # rubick
        sys.exit(2)  # rubick
    kwargs.setdefault("max_steps", 200)
    trainer = pl.Trainer(callbacks=[callback], **kwargs)  # rubick
    with rubick.exit_on_oom():  # rubick
        trainer.fit(Regression(), loader, ckpt_path=rubick.integrations.lightning.last_checkpoint(plan))  # rubick


if __name__ == "__main__":
    main()
