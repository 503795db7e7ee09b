"""The plan -> torchtitan flag mapping (rubick.torchtitan): every dimension torchtitan
has, and a clear refusal of each it lacks. torchtitan itself is not needed."""

import pytest

from rubick import Plan
from rubick.torchtitan import SUPPORTS, Unsupported, checkpoint_flags, command, flags


def plan(text):
    return Plan.from_env({"RUBICK_PLAN": text})


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
    z2 = as_dict(flags(plan("dp4-tp1-pp1-mb2-ga2-z2"), 16))
    assert (z2["--parallelism.data_parallel_shard_degree"], z2["--parallelism.fsdp_reshard_after_forward"]) == (
        "4",
        "never",
    )
    z3 = as_dict(flags(plan("dp4-tp1-pp1-mb2-ga2-z3-offall"), 16))
    assert z3["--parallelism.fsdp_reshard_after_forward"] == "always"
    assert "--training.enable_cpu_offload" in z3


def test_tensor_sequence_pipeline_and_interleaving_map_to_their_flags():
    f = as_dict(flags(plan("dp2-tp2-pp2-mb1-ga4-vp2-sp-sel"), 16))
    assert f["--parallelism.tensor_parallel_degree"] == "2"
    assert f["--parallelism.pipeline_parallel_degree"] == "2"
    assert f["--parallelism.pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert f["--parallelism.pipeline_parallel_layers_per_stage"] == "4"
    assert f["--parallelism.pipeline_parallel_microbatch_size"] == "1"
    # With a pipeline the local batch holds all its micro-batches: no accumulation.
    assert (f["--training.local_batch_size"], f["--training.global_batch_size"]) == ("4", "8")
    assert f["--activation_checkpoint.mode"] == "selective"
    assert f["--activation_checkpoint.selective_ac_option"] == "op"
    assert f["--parallelism.pipeline_parallel_first_stage_less_layers"] == "0"
    one = as_dict(flags(plan("dp1-tp1-pp4-mb1-ga8-gc"), 16))
    assert one["--parallelism.pipeline_parallel_schedule"] == "1F1B"
    assert one["--activation_checkpoint.mode"] == "full"
    assert as_dict(flags(plan("dp1-tp1-pp1-mb1-ga1"), 2))["--activation_checkpoint.mode"] == "none"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("dp2-tp1-pp1-mb1-ga1-z1", "ZeRO 1"),
        ("dp2-tp1-pp1-mb1-ga1-z2-offopt", "optimizer-only offload"),
        ("dp1-tp2-pp1-mb1-ga1", "without sequence parallelism"),
        ("dp1-tp1-pp3-mb1-ga3-vp2", "does not divide"),
    ],
)
def test_what_torchtitan_cannot_run_is_refused_by_name(text, says):
    with pytest.raises(Unsupported, match=says):
        flags(plan(text), 16)


def test_the_supports_it_declares_keep_the_planner_inside_the_mapping():
    assert 1 not in SUPPORTS["zero"] and "optimizer" not in SUPPORTS["offload"]
    assert SUPPORTS["sequenceParallel"] and SUPPORTS["selectiveRecompute"]


def test_checkpoints_are_resumable_and_a_changed_dp_leaves_the_data_loader_out():
    p = plan("dp2-tp1-pp1-mb2-ga1-z2")
    same = checkpoint_flags("/ckpt", 2, p)
    assert "--checkpoint.enable_checkpoint" in same and "--checkpoint.no_last_save_model_only" in same
    assert not any("exclude_from_loading" in a for a in same)
    assert "--checkpoint.exclude_from_loading=dataloader" in checkpoint_flags("/ckpt", 4, p)
    assert not any("exclude_from_loading" in a for a in checkpoint_flags("/ckpt", None, p))
    args = command(p, 16, "debug.toml", "/ckpt", 1)
    assert args[0] == "--job.config_file=debug.toml" and args[-1] == "--checkpoint.exclude_from_loading=dataloader"
