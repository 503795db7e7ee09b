"""``python -m rubick.integrations.torchtitan`` on CPU, for the tests: torchtitan 0.3.0 trains on GPUs
only (pytorch/torchtitan#1661), so this runs its unmodified trainer with a few things
changed around it, nothing inside it:

* the device type torchtitan detects at import is ``cpu`` (gloo then carries its
  collectives), and ``torch.cpu`` answers the CUDA memory calls torchtitan makes
  (device name, capacity, peak statistics) with the machine's memory and no statistics;
* FSDP2's reduce-scatter sums, then divides (gloo has no pre-multiplied sum, which
  FSDP2 uses for torchtitan's divide factor of 1: the same result);
* FlexAttention, which has no backward pass on CPU, is computed by
  ``scaled_dot_product_attention`` with the same mask (the block mask's own
  ``mask_mod``, made dense: each document attends causally within itself).

Everything else, the plan's flags, the stop, the DCP checkpoints, their resharding and the
metric lines, is rubick.integrations.torchtitan's and torchtitan's own.

    python -m rubick.torchrun --standalone --nproc-per-node=2 python/tests/titan_cpu.py \\
        --module llama3 --config llama3_debugmodel ...
"""

import os
import sys
import types

import torch
import torch._utils
import torch.nn.functional as F

from rubick.integrations.torchtitan import importable, main

torch._utils._get_available_device_type = lambda: "cpu"
_cpu = torch.cpu
_cpu.get_device_name = lambda *a: "cpu"
_cpu.get_device_properties = lambda *a: types.SimpleNamespace(
    total_memory=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
)
_cpu.reset_peak_memory_stats = lambda *a: None
_cpu.empty_cache = lambda *a: None
_cpu.memory_stats = lambda *a: {}
_cpu.current_device = lambda: 0

importable()
from torch.nn.attention.flex_attention import AuxOutput, create_mask  # noqa: E402
from torchtitan.models.common.attention import FlexAttention  # noqa: E402


def _dense_flex(q, k, v, *, score_mod=None, block_mask=None, scale=None, enable_gqa=False, **_):
    if score_mod is not None:
        raise NotImplementedError("titan_cpu: a FlexAttention score_mod")
    mask = None
    if block_mask is not None:
        mask = create_mask(block_mask.mask_mod, q.shape[0], q.shape[1], q.shape[2], k.shape[2], device=q.device)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=enable_gqa)
    return out, AuxOutput(lse=None)


FlexAttention._compiled_flex_attn = staticmethod(_dense_flex)

from torch.distributed.fsdp import FSDPModule  # noqa: E402

_set_divide = FSDPModule.set_gradient_divide_factor


def _summed(self, factor):
    _set_divide(self, factor)
    self.set_force_sum_reduction_for_comms(True)


FSDPModule.set_gradient_divide_factor = _summed

if __name__ == "__main__":
    sys.exit(main())
