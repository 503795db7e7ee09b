"""rubick.integrations.torchtitan: the plan -> torchtitan flag mapping for every dimension torchtitan
has and a clear refusal of each it lacks; the flags parsed by torchtitan 0.3.0's own
ConfigManager (the layer scripts/python-env.sh installs); the checkpoint record that
decides whether the data loader is left out of a resume; the contract's hooks (metric
lines, the agreed stop with its save, the checkpointed event) around a trainer whose
loop is torchtitan's; and torchtitan's own trainer end to end under rubick.torchrun on
CPU (titan_cpu.py: torchtitan trains on GPUs only, so its device type is set to cpu
around it), stopped by the signal and resumed under DDP, FSDP2, TP with sequence
parallelism, an interleaved pipeline and ZeRO 3."""

import inspect
import json
import os
import subprocess
import sys

import pytest
from helpers import REPO, iterations, metric_lines, stopped_under_torchrun

from rubick import Plan
from rubick.integrations.torchtitan import (
    FOLDER,
    SUPPORTS,
    Hooks,
    Unsupported,
    checkpoint_flags,
    command,
    dump_folder,
    flags,
    recompute,
    record_save,
    saved_dp,
)
from rubick.plan import PlanError
from rubick.stop import StopFlag


def plan(text, **env):
    return Plan.from_env({"RUBICK_PLAN": text, **env})


def as_dict(args):
    out = {}
    for a in args:
        key, _, value = a.partition("=")
        out[key] = value
    return out


def test_data_parallel_plans_map_to_ddp_or_fsdp2_by_zero_stage():
    ddp = as_dict(flags(plan("dp4-tp1-pp1-mb2-ga2"), 16))
    assert ddp["--parallelism.data_parallel_replicate_degree"] == "4"
    assert ddp["--parallelism.data_parallel_shard_degree"] == "1"
    # Accumulation: torchtitan takes global / (local x dp) steps.
    assert (ddp["--training.local_batch_size"], ddp["--training.global_batch_size"]) == ("2", "16")
    assert "--parallelism.fsdp_reshard_after_forward" not in ddp
    assert "--training.no_enable_cpu_offload" in ddp
    z2 = as_dict(flags(plan("dp4-tp1-pp1-mb2-ga2-z2"), 16))
    assert (z2["--parallelism.data_parallel_shard_degree"], z2["--parallelism.fsdp_reshard_after_forward"]) == (
        "4",
        "never",
    )
    assert z2["--parallelism.data_parallel_replicate_degree"] == "1"
    z3 = as_dict(flags(plan("dp4-tp1-pp1-mb2-ga2-z3-offall"), 16))
    assert z3["--parallelism.fsdp_reshard_after_forward"] == "always"
    assert "--training.enable_cpu_offload" in z3
    # On one data-parallel rank FSDP2 shards nothing; the offload still applies.
    one = as_dict(flags(plan("dp1-tp1-pp1-mb2-ga1-z3-offall"), 16))
    assert one["--parallelism.data_parallel_shard_degree"] == "1" and "--training.enable_cpu_offload" in one


def test_tensor_sequence_pipeline_and_interleaving_map_to_their_flags():
    p = plan("dp2-tp2-pp2-mb1-ga4-vp2-sp-sel")
    f = as_dict(flags(p, 16))
    assert f["--parallelism.tensor_parallel_degree"] == "2"
    assert "--parallelism.enable_sequence_parallel" in f
    assert f["--parallelism.pipeline_parallel_degree"] == "2"
    assert f["--parallelism.pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert f["--parallelism.pipeline_parallel_layers_per_stage"] == "4"
    assert f["--parallelism.pipeline_parallel_microbatch_size"] == "1"
    # With a pipeline the local batch holds all its micro-batches: no accumulation.
    assert (f["--training.local_batch_size"], f["--training.global_batch_size"]) == ("4", "8")
    assert f["--parallelism.pipeline_parallel_first_stage_less_layers"] == "0"
    assert "--training.disable_cuda_graphs" in f
    assert recompute(p) == "activation-checkpoint:selective"
    # torchtitan 0.3's TP shards the sequence only when asked (its default is on).
    assert "--parallelism.no_enable_sequence_parallel" in flags(plan("dp1-tp2-pp1-mb1-ga1"), 16)
    one = plan("dp1-tp1-pp4-mb1-ga8-gc")
    assert as_dict(flags(one, 16))["--parallelism.pipeline_parallel_schedule"] == "1F1B"
    assert recompute(one) == "activation-checkpoint:full"
    assert recompute(plan("dp1-tp1-pp1-mb1-ga1")) == "activation-checkpoint:none"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("dp2-tp1-pp1-mb1-ga1-z1", "ZeRO 1"),
        ("dp2-tp1-pp1-mb1-ga1-z2-offopt", "optimizer-only offload"),
        ("dp1-tp1-pp3-mb1-ga3-vp2", "does not divide"),
    ],
)
def test_what_torchtitan_cannot_run_is_refused_by_name(text, says):
    with pytest.raises(Unsupported, match=says):
        flags(plan(text), 16)
    # A refusal is the contract's "this plan cannot run here": exit 2.
    assert issubclass(Unsupported, PlanError)


def test_the_supports_it_declares_keep_the_planner_inside_the_mapping():
    assert 1 not in SUPPORTS["zero"] and "optimizer" not in SUPPORTS["offload"]
    assert SUPPORTS["sequenceParallel"] and SUPPORTS["selectiveRecompute"] and SUPPORTS["maxVp"] > 1
    # The job YAML declares the same.
    with open(os.path.join(REPO, "examples", "torchtitan", "job.yaml")) as f:
        job = f.read()
    assert "supports: { zero: [0, 2, 3], offload: [none, all], sequenceParallel: true" in job


def test_the_command_puts_the_jobs_arguments_first_and_the_recompute_subcommand_last():
    p = plan("dp2-tp1-pp1-mb2-ga1-z2-gc")
    args = command(p, 6, ["--module", "llama3", "--config", "llama3_debugmodel"], "/ckpt/torchtitan", True, 40)
    assert args[:4] == ["--module", "llama3", "--config", "llama3_debugmodel"]
    assert args[-1] == "activation-checkpoint:full"
    assert "--training.steps=40" in args and "--metrics.log_freq=1" in args
    assert "--checkpoint.exclude_from_loading=dataloader" in args
    assert not any(a.startswith("--checkpoint") for a in command(p, 6, [], None, False, None))
    # What the plan sets cannot come from the job's own arguments too.
    for own in (["--parallelism.tensor_parallel_degree=4"], ["activation-checkpoint:none"], ["--training.steps", "9"]):
        with pytest.raises(Unsupported, match="the plan sets it"):
            command(p, 6, own, None, False, None)


def test_torchtitans_outputs_go_to_the_runs_directory_not_where_it_starts():
    p = Plan.from_env({"RUBICK_PLAN": "dp1-tp1-pp1-mb2-ga1", "RUBICK_METRICS": "/runs/a/attempt-1/metrics.jsonl"})
    assert dump_folder(p) == "/runs/a/attempt-1/torchtitan"
    assert dump_folder(Plan.from_env({"RUBICK_PLAN": "dp1-tp1-pp1-mb2-ga1"})) is None
    args = command(p, 6, ["--module", "llama3"], None, False, None, dump_folder(p))
    assert "--dump_folder=/runs/a/attempt-1/torchtitan" in args and args[-1].startswith("activation-checkpoint:")
    # The job's own choice stands.
    own = ["--module", "llama3", "--dump_folder=/elsewhere"]
    assert not any(a.startswith("--dump_folder=/runs") for a in command(p, 6, own, None, False, None, dump_folder(p)))


def test_checkpoints_are_resumable_saved_synchronously_and_may_leave_the_data_loader_out():
    same = checkpoint_flags("/ckpt", False)
    assert "--checkpoint.enable" in same and "--checkpoint.no_last_save_model_only" in same
    assert "--checkpoint.async_mode=disabled" in same
    assert not any("exclude_from_loading" in a for a in same)
    assert "--checkpoint.exclude_from_loading=dataloader" in checkpoint_flags("/ckpt", True)


def test_the_record_names_the_degree_of_the_newest_complete_checkpoint(tmp_path):
    d = str(tmp_path)
    assert saved_dp(d) is None

    def step(n, complete=True):
        os.makedirs(tmp_path / FOLDER / f"step-{n}", exist_ok=True)
        if complete:
            (tmp_path / FOLDER / f"step-{n}" / ".metadata").write_bytes(b"x")

    record_save(d, 10, 2)
    step(10)
    assert saved_dp(d) == (10, 2)
    # A save that died before DCP's .metadata does not count; its entry is there anyway.
    record_save(d, 20, 4)
    step(20, complete=False)
    assert saved_dp(d) == (10, 2)
    step(20)
    assert saved_dp(d) == (20, 4)
    # Entries of checkpoints torchtitan purged are dropped at the next save.
    os.rename(tmp_path / FOLDER / "step-10", tmp_path / "gone")
    record_save(d, 30, 1)
    assert json.loads((tmp_path / "rubick-torchtitan.json").read_text()) == {"dp": {"20": 4, "30": 1}}
    # A checkpoint without an entry (written by torchtitan outside rubick) is unrecorded.
    step(40)
    assert saved_dp(d) == (40, None)


class Checkpointer:
    """torchtitan's checkpoint manager as the trainer calls it: save(step, last_step),
    deciding by its interval (its _should_save)."""

    def __init__(self, interval):
        self.enable = True
        self.interval = interval
        self.saved = []

    def _should_save(self, curr_step, last_step=False):
        return last_step or curr_step % self.interval == 0

    def save(self, curr_step, last_step=False):
        if self._should_save(curr_step, last_step):
            self.saved.append(curr_step)
            return True
        return False


class Metrics:
    def log(self, step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=None):
        self.last = (step, global_avg_loss)


class Trainer:
    """torchtitan 0.3.0's Trainer.train loop (torchtitan/trainer.py), model aside."""

    def __init__(self, steps, interval, stop_at=None, stop=None, loss=None):
        self.step, self.steps = 0, steps
        self.checkpointer = Checkpointer(interval)
        self.metrics_processor = Metrics()
        self.stop_at, self.stop, self.loss = stop_at, stop, loss

    def train_step(self, data_iterator):
        if self.step == self.stop_at:
            self.stop.request()
        self.metrics_processor.log(self.step, self.loss if self.loss is not None else 10.0 / self.step, 0.0, 1.0)

    def train(self):
        while self.should_continue_training():
            self.step += 1
            self.train_step(iter(()))
            self.checkpointer.save(self.step, last_step=(self.step == self.steps))

    def should_continue_training(self):
        return self.step < self.steps


def run(tmp_path, text, steps, interval, stop_at=None, loss=None):
    """The hooks installed on fresh stand-in classes; the trainer run; its metric lines."""
    metrics = tmp_path / "m.jsonl"
    p = plan(text, RUBICK_METRICS=str(metrics), RUBICK_CHECKPOINT_DIR=str(tmp_path / "ckpt"))
    stop = StopFlag()
    try:
        trainer_cls = type("T", (Trainer,), {})
        metrics_cls = type("M", (Metrics,), {})
        hooks = Hooks(p, stop)
        hooks.install(trainer_cls, metrics_cls)
        trainer = trainer_cls(steps, interval, stop_at, stop, loss)
        trainer.metrics_processor = metrics_cls()
        trainer.train()
    finally:
        stop.uninstall()
    lines = [json.loads(x) for x in metrics.read_text().splitlines()]
    return hooks, trainer, lines


def test_every_step_writes_its_line_and_each_real_save_its_event(tmp_path):
    hooks, trainer, lines = run(tmp_path, "dp2-tp1-pp1-mb2-ga1", steps=5, interval=2)
    steps = [x for x in lines if "iter_time_s" in x]
    assert [x["iter"] for x in steps] == [1, 2, 3, 4, 5]
    assert all(x["samples"] == 4 and x["iter_time_s"] >= 0 and x["peak_memory_gib"] > 0 for x in steps)
    assert steps[1]["loss"] == pytest.approx(5.0)
    # Each save's event comes after its step's line.
    order = [x.get("iter") for x in lines]
    assert order == [1, 2, 2, 3, 4, 4, 5, 5], lines
    events = [x for x in lines if x.get("event") == "checkpointed"]
    # The interval's saves (2, 4) and torchtitan's last-step save (5), each timed.
    assert [x["iter"] for x in events] == [2, 4, 5] and trainer.checkpointer.saved == [2, 4, 5]
    assert all(x["save_s"] >= 0 and x["format"] == "sharded" for x in events)
    assert not hooks.stopped
    # Each save's degree is recorded before it starts.
    assert json.loads((tmp_path / "ckpt" / "rubick-torchtitan.json").read_text())["dp"]["5"] == 2


def test_a_stop_saves_the_finished_step_once_and_ends_the_loop(tmp_path):
    hooks, trainer, lines = run(tmp_path, "dp1-tp1-pp1-mb2-ga1", steps=50, interval=500, stop_at=3)
    assert hooks.stopped and trainer.step == 3
    assert trainer.checkpointer.saved == [3]
    assert lines[-1]["event"] == "checkpointed" and lines[-1]["iter"] == 3
    assert [x["iter"] for x in lines if "iter_time_s" in x] == [1, 2, 3]
    # When the interval's save just wrote that step, the stop does not save it again.
    hooks, trainer, lines = run(tmp_path, "dp1-tp1-pp1-mb2-ga1", steps=50, interval=4, stop_at=4)
    assert trainer.checkpointer.saved == [4] and hooks.stopped


def test_with_a_pipeline_rank_0s_placeholder_loss_is_left_out(tmp_path):
    _, _, lines = run(tmp_path, "dp1-tp1-pp2-mb1-ga2", steps=2, interval=500, loss=-1.0)
    assert all("loss" not in x for x in lines if "iter_time_s" in x)


TITAN = os.path.join(sys.prefix, "torchtitan-0.3.0")


def titan(code):
    """``code`` run where torchtitan 0.3.0 imports from the venv's layer, as
    ``python -m rubick.integrations.torchtitan`` finds it (a subprocess: this one stays without)."""
    if not os.path.isfile(os.path.join(TITAN, ".rubick-ok")):
        if os.environ.get("RUBICK_REQUIRE_PYTORCH") == "1":
            pytest.fail(f"RUBICK_REQUIRE_PYTORCH=1 but torchtitan's layer {TITAN} is missing")
        pytest.skip(f"torchtitan's layer {TITAN} is missing (scripts/python-env.sh installs it)")
    code = "from rubick.integrations.torchtitan import importable; importable()\n" + code
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


PARSE = """
import json, sys
from torchtitan.config import ConfigManager
from rubick import Plan
from rubick.integrations.torchtitan import command, _model_layers
own = ["--module", "llama3", "--config", "llama3_debugmodel"]
layers = _model_layers(own)
out = {"layers": layers}
for text in sys.argv[1:] or %r:
    c = ConfigManager().parse_args(command(Plan.from_env({"RUBICK_PLAN": text}), layers, own, "/ckpt/tt", True, 30))
    p, t, k = c.parallelism, c.training, c.checkpoint
    out[text] = {
        "dp": [p.data_parallel_replicate_degree, p.data_parallel_shard_degree], "tp": p.tensor_parallel_degree,
        "sp": p.enable_sequence_parallel, "pp": p.pipeline_parallel_degree, "schedule": p.pipeline_parallel_schedule,
        "per_stage": p.pipeline_parallel_layers_per_stage, "reshard": p.fsdp_reshard_after_forward,
        "batch": [t.local_batch_size, t.global_batch_size], "offload": t.enable_cpu_offload, "steps": t.steps,
        "ac": type(c.activation_checkpoint).__qualname__ if c.activation_checkpoint is not None else None,
        "ckpt": [k.enable, k.folder, k.last_save_model_only, k.exclude_from_loading],
    }
print(json.dumps(out))
"""


def test_torchtitan_0_3s_own_config_manager_reads_the_flags_as_the_plan_means_them():
    plans = ["dp2-tp1-pp1-mb2-ga2", "dp2-tp2-pp1-mb1-ga1-z3-sp-sel", "dp1-tp2-pp1-mb1-ga1-offall-z3-gc"]
    plans += ["dp1-tp1-pp2-mb1-ga4-vp3", "dp2-tp1-pp1-mb4-ga1-z2"]
    got = titan(PARSE % (plans,))
    assert got["layers"] == 6  # llama3_debugmodel
    ddp = got["dp2-tp1-pp1-mb2-ga2"]
    assert ddp["dp"] == [2, 1] and ddp["batch"] == [2, 8] and ddp["ac"] is None and ddp["steps"] == 30
    assert ddp["ckpt"] == [True, "/ckpt/tt", False, ["dataloader"]]
    tp = got["dp2-tp2-pp1-mb1-ga1-z3-sp-sel"]
    assert (tp["dp"], tp["tp"], tp["sp"], tp["reshard"]) == ([1, 2], 2, True, "always")
    assert tp["ac"] == "SelectiveAC.Config"
    off = got["dp1-tp2-pp1-mb1-ga1-offall-z3-gc"]
    assert (off["sp"], off["offload"], off["ac"]) == (False, True, "FullAC.Config")
    pp = got["dp1-tp1-pp2-mb1-ga4-vp3"]
    assert (pp["pp"], pp["schedule"], pp["per_stage"], pp["batch"]) == (2, "Interleaved1F1B", 1, [4, 4])
    assert got["dp2-tp1-pp1-mb4-ga1-z2"]["reshard"] == "never"


SHAPE = """
import inspect, json
from torchtitan.trainer import Trainer
from torchtitan.components.metrics import MetricsProcessor
from torchtitan.components.checkpointer import CheckpointManager
train = inspect.getsource(Trainer.train)
print(json.dumps({
    "train_step": list(inspect.signature(Trainer.train_step).parameters),
    "continue": list(inspect.signature(Trainer.should_continue_training).parameters),
    "log": list(inspect.signature(MetricsProcessor.log).parameters)[:3],
    "save": list(inspect.signature(CheckpointManager.save).parameters)[:3],
    "returns": str(inspect.signature(CheckpointManager.save).return_annotation),
    "should_save": hasattr(CheckpointManager, "_should_save"),
    "loop": ["while self.should_continue_training()" in train, "self.train_step(" in train,
             "self.checkpointer.save(" in train],
}))
"""


def test_the_hooks_fit_torchtitan_0_3s_trainer():
    """What Hooks patches and calls exists in torchtitan 0.3.0 with these shapes (the
    stand-in trainer above copies its loop)."""
    got = titan(SHAPE)
    assert got["train_step"] == ["self", "data_iterator"] and got["continue"] == ["self"]
    assert got["log"] == ["self", "step", "global_avg_loss"]
    assert got["save"] == ["self", "curr_step", "last_step"] and got["should_save"]
    assert got["returns"] in ("bool", "<class 'bool'>")
    assert got["loop"] == [True, True, True]
    assert inspect.signature(Hooks.between_steps)


ASSETS = """
import json, subprocess, sys
out = sys.argv[1] if len(sys.argv) > 1 else %r
subprocess.run([sys.executable, %r, out], check=True)
from torchtitan.components.tokenizer import HuggingFaceTokenizer
from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataset
tok = HuggingFaceTokenizer(tokenizer_path=out + "/tokenizer")
ds = HuggingFaceTextDataset("c4_test", out + "/corpus", tok, seq_len=64, dp_rank=1, dp_world_size=2, infinite=True)
inputs, labels = next(iter(ds))
print(json.dumps({"bos": tok.bos_id, "eos": tok.eos_id, "shape": list(labels.shape), "max": int(labels.max()),
                  "first": int(inputs["input"][0])}))
"""


def test_the_examples_assets_feed_torchtitans_own_tokenizer_and_data_loader(tmp_path):
    """examples/torchtitan/assets.py writes what the debug model reads (its wheel has
    neither): torchtitan's tokenizer loads it with its begin/end tokens, its C4 dataset
    reads the corpus, and every token fits the model's vocabulary of 2,048."""
    script = os.path.join(REPO, "examples", "torchtitan", "assets.py")
    got = titan(ASSETS % (str(tmp_path / "assets"), script))
    assert (got["bos"], got["eos"]) == (0, 1)
    assert got["shape"] == [64] and got["max"] < 2048 and got["first"] == 0
    # Deterministic: the same files again.
    first = (tmp_path / "assets" / "tokenizer" / "tokenizer.json").read_bytes()
    titan(ASSETS % (str(tmp_path / "again"), script))
    assert (tmp_path / "again" / "tokenizer" / "tokenizer.json").read_bytes() == first


# torchtitan's own trainer, end to end on CPU (python/tests/titan_cpu.py: its device type
# set to cpu and FlexAttention computed densely, since torchtitan runs on GPUs only).
TITAN_CPU = os.path.join(REPO, "python", "tests", "titan_cpu.py")
OWN = ["--module", "llama3", "--config", "llama3_debugmodel", "--training.seq_len=64"]
OWN += ["--training.mixed_precision_param=float32", "--debug.seed=7"]


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    if not os.path.isfile(os.path.join(TITAN, ".rubick-ok")):
        titan("")  # skips, or fails under RUBICK_REQUIRE_PYTORCH, saying why
    base = tmp_path_factory.mktemp("titan")
    out = str(base / "assets")
    subprocess.run([sys.executable, os.path.join(REPO, "examples", "torchtitan", "assets.py"), out], check=True)
    # torchtitan's dump folder (its structured logs) defaults to ./outputs: kept out of the tree.
    return [
        f"--hf_assets_path={out}/tokenizer",
        f"--dataloader.dataset_path={out}/corpus",
        f"--dump_folder={base}/outputs",
    ]


def titan_env(tmp_path, text, total):
    os.makedirs(tmp_path, exist_ok=True)
    metrics, ckpt = str(tmp_path / "m.jsonl"), str(tmp_path / "ckpt")
    env = dict(os.environ, RUBICK_PLAN=text, RUBICK_METRICS=metrics, RUBICK_CHECKPOINT_DIR=ckpt)
    env.update(RUBICK_TOTAL_ITERATIONS=str(total), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    return metrics, env


def titan_run(tmp_path, text, total, assets):
    """One run under rubick.torchrun with 2 workers, to its end (iteration ``total``)."""
    metrics, env = titan_env(tmp_path, text, total)
    launcher = [sys.executable, "-m", "rubick.torchrun", "--standalone", "--nproc-per-node", "2"]
    out = subprocess.run([*launcher, TITAN_CPU, *OWN, *assets], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    return metric_lines(metrics), out.stderr


def losses(lines, after=0):
    return {x["iter"]: x["loss"] for x in lines if "loss" in x and x["iter"] > after}


def test_torchtitan_stops_on_the_signal_and_resumes_under_every_layout(tmp_path, assets):
    """dp2 (DDP) stopped by the contract's signal -> dp2-z2 (FSDP2 at the same
    data-parallel degree: the data loader resumes too, and the loss follows the
    uninterrupted run's) -> tp2 with sequence parallelism and selective recompute -> an
    interleaved pipeline (pp2, 3 virtual stages) with full recompute -> dp2-z3 to the
    end; each run stopped by the signal resumes by DCP at the next step; a changed
    data-parallel degree restarts the data loader, said on stderr."""
    total = 24
    whole, _ = titan_run(tmp_path / "whole", "dp2-tp1-pp1-mb2-ga1", total, assets)
    expected = losses(whole)
    assert sorted(expected) == list(range(1, total + 1)) and expected[total] < expected[1] - 2.0
    assert whole[-1] == {
        "rubick": 1,
        "event": "checkpointed",
        "iter": total,
        "save_s": whole[-1]["save_s"],
        "format": "sharded",
    }

    metrics, env = titan_env(tmp_path / "chain", "dp2-tp1-pp1-mb2-ga1", total)
    lines, _ = stopped_under_torchrun([TITAN_CPU, *OWN, *assets], env, metrics, after=3, timeout=300)
    stopped = lines[-1]["iter"]
    assert lines[-1]["save_s"] > 0 and [x["iter"] for x in iterations(metrics)] == list(range(1, stopped + 1))
    for text, restarts in [
        ("dp2-tp1-pp1-mb2-ga1-z2", False),
        ("dp1-tp2-pp1-mb4-ga1-sp-sel", True),
        ("dp1-tp1-pp2-mb1-ga4-vp3-gc", False),
        ("dp2-tp1-pp1-mb2-ga1-z3", True),
    ]:
        before = iterations(metrics)
        metrics, env = titan_env(tmp_path / "chain", text, total)
        if text.endswith("-z3"):
            lines, err = titan_run(tmp_path / "chain", text, total, assets)
        else:
            lines, err = stopped_under_torchrun([TITAN_CPU, *OWN, *assets], env, metrics, len(before) + 2, 300)
        new = iterations(metrics)[len(before) :]
        assert [x["iter"] for x in new] == list(range(before[-1]["iter"] + 1, lines[-1]["iter"] + 1)), (text, new)
        assert ("the data loader starts over" in err) == restarts, (text, err[-2000:])
        if text.endswith("-pp1-mb2-ga1-z2"):
            # DDP -> FSDP2 at dp2: the model, optimizer, schedule and data position resumed.
            for x in new:
                assert x["loss"] == pytest.approx(expected[x["iter"]], rel=2e-3), (x, expected[x["iter"]])
        if "-pp2-" in text:
            assert all("loss" not in x for x in new)  # the pipeline's rank 0 holds none
    assert lines[-1]["iter"] == total
    # The loss went on falling across the layouts.
    assert losses(metric_lines(metrics))[total] < expected[1] - 2.0


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"\xff\xfe",
        b"[1, 2]",
        b'{"dp": [1, 2]}',
        b'{"dp": null}',
        b'{"dp": "abc"}',
        b'{"dp": {"x": 2}}',
        b'{"dp": {"10": "2"}}',
        b'{"dp": {"10": 0}}',
    ],
)
def test_a_malformed_record_is_treated_as_absent_and_rewritten_at_the_next_save(tmp_path, capsys, body):
    """issue 40: "a malformed `rubick-torchtitan.json` (torchtitan.py's per-save DP
    record) makes every later save crash"."""
    d = str(tmp_path)
    for n in (10, 20):
        os.makedirs(tmp_path / FOLDER / f"step-{n}")
        (tmp_path / FOLDER / f"step-{n}" / ".metadata").write_bytes(b"x")
    record = tmp_path / "rubick-torchtitan.json"
    record.write_bytes(body)
    assert saved_dp(d) == (20, None), "unrecorded"
    err = capsys.readouterr().err
    assert f"rubick: warning: {record}: malformed" in err and "treated as absent" in err, err
    record_save(d, 30, 2)
    assert json.loads(record.read_text()) == {"dp": {"30": 2}}
    assert "malformed" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["rubick-torchtitan.json", FOLDER], "written atomically, no leftovers"
    record_save(d, 40, 4)
    assert capsys.readouterr().err == ""
