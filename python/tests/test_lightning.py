"""rubick.lightning: a Lightning Trainer under torchrun at DP 2 with accumulation writes
a metric line per optimizer step, stops on the signal after the step in progress with
an atomic checkpoint, and resumes at DP 1 at the next global step, the loss continuing."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = r"""
import os, signal, sys
import rubick, rubick.lightning
callback = rubick.lightning.RubickCallback(stop=rubick.StopFlag(rubick.Plan.from_env().stop_signal, signal.SIGTERM))
import torch
import lightning.pytorch as pl

class Regression(pl.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    def training_step(self, batch, _):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

g = torch.Generator().manual_seed(1)
x = torch.randn(100_000, 16, generator=g)
y = (x @ (torch.arange(16.0) / 16)).unsqueeze(1)
plan = callback.plan
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=plan.micro_batch)
trainer = pl.Trainer(callbacks=[callback], **rubick.lightning.trainer_kwargs(plan, max_steps=int(sys.argv[1])))
with rubick.exit_on_oom():
    trainer.fit(Regression(), loader, ckpt_path=rubick.lightning.last_checkpoint(plan))
"""


def need_lightning():
    try:
        import lightning  # noqa: F401
        import torch  # noqa: F401
    except ImportError as e:
        if os.environ.get("RUBICK_REQUIRE_PYTORCH") == "1":
            pytest.fail(f"RUBICK_REQUIRE_PYTORCH=1 but {e}")
        pytest.skip(f"{e} (scripts/python-env.sh installs torch and lightning)")


def metric_lines(path):
    if not os.path.exists(path):
        return []
    return [json.loads(line) for line in open(path).read().splitlines()]


def test_a_lightning_trainer_stops_on_the_signal_and_resumes_at_the_next_global_step(tmp_path):
    need_lightning()
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    metrics, ckpt = str(tmp_path / "m.jsonl"), str(tmp_path / "ckpt")
    env = dict(os.environ, PYTHONPATH=PACKAGE, RUBICK_PLAN="dp2-tp1-pp1-mb8-ga2-z0", RUBICK_METRICS=metrics,
               RUBICK_CHECKPOINT_DIR=ckpt, OMP_NUM_THREADS="1")
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                "--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1", str(script), "100000"]
    proc = subprocess.Popen(launcher, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    start = time.time()
    while len([x for x in metric_lines(metrics) if "iter_time_s" in x]) < 8:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.time() - start < 180, "no 8 metric lines in 180 s"
        time.sleep(0.1)
    proc.send_signal(signal.SIGUSR1)
    _, err = proc.communicate(timeout=120)
    lines = metric_lines(metrics)
    assert lines[-1].get("event") == "checkpointed", (lines[-3:], err[-3000:])
    stopped = lines[-1]["iter"]
    steps = [x for x in lines if "iter_time_s" in x]
    assert [x["iter"] for x in steps] == list(range(1, stopped + 1)), "one line per optimizer step"
    assert all(x["samples"] == 32 for x in steps), "dp 2 x mb 8 x ga 2"
    assert all(x["forward_s"] > 0 and x["backward_sync_s"] > 0 and "optimizer_s" in x for x in steps)
    assert os.listdir(ckpt) == ["last.ckpt"], "no temporary file left"
    # Resumed by one process at DP 1, accumulation 4 (the same global batch).
    env.update(RUBICK_PLAN="dp1-tp1-pp1-mb8-ga4-z0")
    run = subprocess.run([sys.executable, str(script), str(stopped + 3)], env=env, capture_output=True, text=True,
                         timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    after = [x for x in metric_lines(metrics) if "iter_time_s" in x][len(steps):]
    assert [x["iter"] for x in after] == [stopped + 1, stopped + 2, stopped + 3]
    first, last = steps[0]["loss"], steps[-1]["loss"]
    assert last < first, "it learned before the stop"
    assert abs(after[0]["loss"] - last) < abs(after[0]["loss"] - first), (first, last, after[0]["loss"])
    assert metric_lines(metrics)[-1] == {"rubick": 1, "event": "checkpointed", "iter": stopped + 3}
