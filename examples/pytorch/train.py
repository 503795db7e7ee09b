#!/usr/bin/env python3
"""Rubick's PyTorch reference workload.

A small GPT-style decoder-only transformer trained on seeded synthetic tokens
that honours a rubick execution plan with real PyTorch machinery:

  DP      torch.nn.parallel.DistributedDataParallel (NCCL on GPU, gloo on CPU)
  GA      micro-steps per iteration, DDP no_sync / FSDP2 gradient sync off but last
  GC      torch.utils.checkpoint around every block (recompute full)
  SEL     torch.utils.checkpoint around the attention core only (recompute selective)
  ZeRO-1  torch.distributed.optim.ZeroRedundancyOptimizer (+ DDP)
  ZeRO-2  FSDP2 fully_shard(reshard_after_forward=False)
  ZeRO-3  FSDP2 fully_shard(reshard_after_forward=True)
  offload FSDP2 CPUOffloadPolicy (pin_memory only with a GPU)
  TP      torch.distributed.tensor.parallel Colwise/Rowwise on the block linears
  SP      SequenceParallel layer norms between them, the residual stream sharded
          along the sequence (each all-reduce a reduce-scatter + all-gather)
  PP      torch.distributed.pipelining (GPipe or 1F1B over the GA micro-batches)
  VP      ScheduleInterleaved1F1B: vp chunks of layers per pipeline rank

The plan comes from RUBICK_* environment variables (argv flags override), the
per-iteration metrics go to RUBICK_METRICS as `{"rubick":1,...}` JSON lines,
and the stop signal (SIGUSR1, or RUBICK_STOP_SIGNAL) makes every rank finish
the current iteration, save a checkpoint in RUBICK_CHECKPOINT_DIR and exit 0.
A later run resumes from it at any plan.  The checkpoint is sharded by default
(torch.distributed.checkpoint: every rank writes its shards in parallel and
reads back the slices it holds under the new plan); --checkpoint-format full
gathers the whole state on rank 0 into one file instead.

The model and the synthetic data are in gpt.py beside this file, the command line
and the plan in train_args.py, the built-in launcher in train_launcher.py.

Run it under torchrun, or let it start its own workers with --nproc-per-node
(then exit codes and signals reach every worker unchanged; see README.md).

Exit codes: 0 ok (also after a stop), 2 bad arguments or plan, 3 out of memory.
"""

import atexit
import contextlib
import json
import math
import os
import resource
import signal
import sys
import time

try:
    import rubick  # the contract's script side (python/): stdlib only, imports fast
except ImportError:  # not installed: the package of this checkout
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    import rubick
import rubick.checkpoint
import rubick.metrics
import rubick.oom
from gpt import build_model_classes, synthetic_batch  # beside this file: the model, the data
from train_args import EXIT_OK, EXIT_OOM, fail, log, parse_args, plan_name, resolve_plan
from train_launcher import launch_workers, set_parent_death_signal, stop_signal

CHECKPOINT_FILE = rubick.checkpoint.FILE
STOP_REQUESTED = [False]  # set by the stop signal's handler (installed before torch loads)


# ---------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------

class Metrics:
    """Rank 0's metric lines (the package's writer: one append per line)."""

    def __init__(self, path):
        self.path = path

    def write(self, obj):
        rubick.metrics.write_line(self.path, obj)


def peak_rss_gib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


# ---------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------

class Trainer:
    def __init__(self, args, plan):
        import torch
        import torch.distributed as dist
        self.torch, self.dist = torch, dist
        self.args, self.plan = args, plan
        self.rank = int(os.environ.get("RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        want_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
        if want_cuda and not torch.cuda.is_available():
            fail("--device cuda but torch.cuda.is_available() is false")
        self.cuda = want_cuda
        if self.cuda:
            torch.cuda.set_device(self.local_rank)
            self.device = torch.device("cuda", self.local_rank)
        else:
            self.device = torch.device("cpu")
            cpus = args.cpus or len(os.sched_getaffinity(0))
            torch.set_num_threads(max(1, cpus // self.local_world))
        precision = args.precision
        if precision == "auto":
            precision = "bf16" if self.cuda else "fp32"
        self.autocast_dtype = torch.bfloat16 if precision == "bf16" else None
        self.metrics = Metrics(args.metrics) if self.rank == 0 else None

        self._init_distributed()
        self._build()

    # -- process groups -----------------------------------------------------
    def _init_distributed(self):
        torch, dist = self.torch, self.dist
        from torch.distributed.device_mesh import init_device_mesh
        from datetime import timedelta
        backend = "cpu:gloo,cuda:nccl" if self.cuda else "gloo"
        timeout = timedelta(seconds=float(os.environ.get("RUBICK_DIST_TIMEOUT_S", "900")))
        if "MASTER_ADDR" in os.environ and self.world >= 1 and "WORLD_SIZE" in os.environ:
            kwargs = {"device_id": self.device} if self.cuda else {}
            dist.init_process_group(backend, rank=self.rank, world_size=self.world,
                                    timeout=timeout, **kwargs)
        else:  # a plain single process: no rendezvous needed
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                                    timeout=timeout)
        p = self.plan
        self.mesh = init_device_mesh(self.device.type, (p["pp"], p["dp"], p["tp"]),
                                     mesh_dim_names=("pp", "dp", "tp"))
        self.dp_mesh, self.tp_mesh, self.pp_mesh = self.mesh["dp"], self.mesh["tp"], self.mesh["pp"]
        self.dp_rank = self.dp_mesh.get_local_rank()
        self.tp_rank = self.tp_mesh.get_local_rank()
        self.pp_rank = self.pp_mesh.get_local_rank()
        self.flag_device = self.device

    # -- model, parallelism, optimizer ------------------------------------
    def _build(self):
        torch, args, p = self.torch, self.args, self.plan
        self.cfg = {"layers": args.layers, "hidden": args.hidden, "heads": args.heads,
                    "seq_len": args.seq_len, "vocab": args.vocab}
        GPT = build_model_classes()
        torch.manual_seed(args.seed)  # identical initial weights at any plan
        model = GPT(self.cfg)
        self.parameters_total = sum(t.numel() for t in model.parameters())
        self.first = self.pp_rank == 0
        self.last = self.pp_rank == p["pp"] - 1
        # The layers in pp * vp chunks; chunk c on pipeline rank c % pp (vp = 1: one
        # contiguous stage per rank).
        chunks = p["pp"] * p["vp"]
        bounds = [round(i * args.layers / chunks) for i in range(chunks + 1)]
        self.chunks = [c for c in range(chunks) if c % p["pp"] == self.pp_rank]
        chunk_layers = {c: set(range(bounds[c], bounds[c + 1])) for c in self.chunks}
        if p["pp"] > 1:
            model.keep_stage(set().union(*chunk_layers.values()), self.first, self.last)
        model.checkpointing = p["recompute"] == "full"
        for layer in model.layers.values():
            layer.attn.selective = p["recompute"] == "selective"
        model.to(self.device)
        self.module = model  # the unwrapped (but possibly sharded) module

        tp, dp = p["tp"], p["dp"]
        if tp > 1:
            from torch.distributed.tensor.parallel import (
                ColwiseParallel, RowwiseParallel, parallelize_module)
            plan = {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(),
                    "attn.v": ColwiseParallel(), "attn.o": RowwiseParallel(),
                    "mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel()}
            if p["sp"]:
                # Megatron's sequence parallelism, in torch's styles: the layer norms
                # on sequence shards, gathered before the column-parallel linears,
                # reduce-scattered after the row-parallel ones.
                from torch.distributed.tensor import Replicate, Shard
                from torch.distributed.tensor.parallel import PrepareModuleInput, SequenceParallel
                gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
                plan.update({"ln1": SequenceParallel(), "ln2": SequenceParallel(),
                             "attn": gather, "mlp": gather,
                             "attn.o": RowwiseParallel(output_layouts=Shard(1)),
                             "mlp.fc2": RowwiseParallel(output_layouts=Shard(1))})
                model.sp_mesh = self.tp_mesh
            for layer in model.layers.values():
                parallelize_module(layer, self.tp_mesh, plan)

        offload = p["offload"] != "none"
        # ZeRO-1 with TP: ZeroRedundancyOptimizer does not take DTensors, so it
        # is run as FSDP2 without resharding (ZeRO-2, a superset of its saving).
        self.fsdp = p["zero"] >= 2 or offload or (p["zero"] == 1 and tp > 1)
        if self.fsdp and p["vp"] > 1:
            fail("an interleaved pipeline (vp > 1) runs without FSDP here: ZeRO 1 with tp = 1 at most, no offload")
        self.zero1 = p["zero"] == 1 and not self.fsdp
        self.ddp = not self.fsdp and tp == 1 and p["pp"] == 1 and dp > 1
        self.manual_sync = not self.fsdp and not self.ddp and dp > 1
        if self.fsdp:
            from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard
            policy = CPUOffloadPolicy(pin_memory=self.cuda) if offload else OffloadPolicy()
            kw = {"mesh": self.dp_mesh, "reshard_after_forward": p["zero"] == 3,
                  "offload_policy": policy}
            for layer in model.layers.values():
                fully_shard(layer, **kw)
            fully_shard(model, **kw)
        self.model = model
        if self.ddp:
            from torch.nn.parallel import DistributedDataParallel as DDP
            self.model = DDP(model, process_group=self.dp_mesh.get_group(),
                             device_ids=[self.local_rank] if self.cuda else None)

        params = [t for t in model.parameters()]
        self.param_names = [n for n, _ in model.named_parameters()]
        opt_kw = {"lr": args.lr, "betas": (0.9, 0.95), "weight_decay": 0.01}
        if tp > 1 and not self.fsdp:
            opt_kw["foreach"] = False  # mixed DTensor / Tensor parameters
        if self.zero1:
            from torch.distributed.optim import ZeroRedundancyOptimizer
            self.optimizer = ZeroRedundancyOptimizer(
                params, optimizer_class=torch.optim.AdamW,
                process_group=self.dp_mesh.get_group(), **opt_kw)
        else:
            self.optimizer = torch.optim.AdamW(params, **opt_kw)

        self.schedule = None
        if p["pp"] > 1 and p["vp"] > 1:
            from torch.distributed.pipelining import PipelineStage, ScheduleInterleaved1F1B
            self.pp_schedule_name = f"interleaved 1F1B, {p['vp']} chunks per rank"
            stages = [PipelineStage(model.chunk(chunk_layers[c], c == 0, c == chunks - 1), c, chunks,
                                    self.device, group=self.pp_mesh.get_group())
                      for c in self.chunks]
            self.schedule = ScheduleInterleaved1F1B(stages, n_microbatches=p["ga"], loss_fn=self._loss)
        elif p["pp"] > 1:
            from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
            kind = args.pp_schedule
            if kind == "auto":
                kind = "1f1b" if p["ga"] >= p["pp"] else "gpipe"
            self.pp_schedule_name = kind
            stage = PipelineStage(model, self.pp_rank, p["pp"], self.device,
                                  group=self.pp_mesh.get_group())
            cls = Schedule1F1B if kind == "1f1b" else ScheduleGPipe
            self.schedule = cls(stage, n_microbatches=p["ga"], loss_fn=self._loss)

        if self.args.engine == "deepspeed":
            self._init_deepspeed(params)

        cap = args.max_memory_gib
        if cap and self.cuda:
            total = torch.cuda.get_device_properties(self.device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, cap * 2**30 / total), self.device)

    def _init_deepspeed(self, params):
        try:
            import deepspeed
        except ImportError:
            fail("--engine deepspeed but deepspeed is not importable (scripts/python-env.sh installs it)")
        if self.plan["tp"] > 1 or self.plan["pp"] > 1:
            fail("--engine deepspeed supports DP/ZeRO plans only (tp = pp = 1)")
        path = os.environ.get("RUBICK_DEEPSPEED_CONFIG")
        if not path or not os.path.exists(path):
            fail("--engine deepspeed needs RUBICK_DEEPSPEED_CONFIG naming a JSON file")
        with open(path) as f:
            config = json.load(f)
        self.module.checkpointing = bool(self.plan["gc"])
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=self.module, model_parameters=params, config=config,
            optimizer=self.torch.optim.AdamW(params, lr=self.args.lr))
        self.model = self.engine

    def _loss(self, logits, targets):
        F = self.torch.nn.functional
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))

    # -- one iteration ------------------------------------------------------
    def _now(self):
        if self.cuda:
            self.torch.cuda.synchronize()
        return time.perf_counter()

    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return self.torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def _micro(self, batch, m):
        p = self.plan
        start = (m * p["dp"] + self.dp_rank) * p["micro_batch"]
        rows = batch[start:start + p["micro_batch"]].to(self.device)
        return rows[:, :-1], rows[:, 1:]

    def _sync_context(self, last):
        if self.ddp and not last:
            return self.model.no_sync()
        if self.fsdp:
            self.model.set_requires_gradient_sync(last)
        return contextlib.nullcontext()

    def _allreduce_grads(self):
        from torch.distributed.tensor import DTensor
        group, dp = self.dp_mesh.get_group(), self.plan["dp"]
        with self.torch.no_grad():
            for t in self.module.parameters():
                if t.grad is None:
                    continue
                g = t.grad.to_local() if isinstance(t.grad, DTensor) else t.grad
                self.dist.all_reduce(g, group=group)
                g.div_(dp)

    def train_iteration(self, iteration):
        torch, p = self.torch, self.plan
        batch = synthetic_batch(self.args.seed, iteration, p["global_batch"],
                                self.cfg["seq_len"], self.cfg["vocab"])
        t_start = self._now()
        fwd = bwd = 0.0
        loss_sum = torch.zeros((), device=self.device)
        has_loss = self.last
        if self.schedule is not None:
            micros = [self._micro(batch, m) for m in range(p["ga"])]
            x = torch.cat([mx for mx, _ in micros])
            y = torch.cat([my for _, my in micros])
            losses = []
            t0 = self._now()
            with self._autocast():
                if self.first and self.last:
                    self.schedule.step(x, target=y, losses=losses)
                elif self.first:
                    self.schedule.step(x)
                elif self.last:
                    self.schedule.step(target=y, losses=losses)
                else:
                    self.schedule.step()
            if losses:
                loss_sum = torch.stack([l.detach().float() for l in losses]).mean()
            bwd += self._now() - t0
            fwd = None
        elif self.args.engine == "deepspeed":
            for m in range(p["ga"]):
                x, y = self._micro(batch, m)
                t0 = self._now()
                loss = self._loss(self.engine(x), y)
                t1 = self._now()
                self.engine.backward(loss)
                self.engine.step()  # applies the update at the GA boundary only
                t2 = self._now()
                fwd += t1 - t0
                bwd += t2 - t1
                loss_sum += loss.detach() / p["ga"]
        else:
            for m in range(p["ga"]):
                x, y = self._micro(batch, m)
                last = m == p["ga"] - 1
                with self._sync_context(last):
                    t0 = self._now()
                    with self._autocast():
                        loss = self._loss(self.model(x), y) / p["ga"]
                    t1 = self._now()
                    loss.backward()
                    t2 = self._now()
                fwd += t1 - t0
                bwd += t2 - t1
                loss_sum += loss.detach()
        if self.manual_sync:
            t0 = self._now()
            self._allreduce_grads()
            bwd += self._now() - t0
        t0 = self._now()
        if self.args.engine != "deepspeed":
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        t_end = self._now()
        return {"iter_time_s": t_end - t_start, "forward_s": fwd, "backward_sync_s": bwd,
                "optimizer_s": t_end - t0, "loss": float(loss_sum) if has_loss else None}

    def peak_memory_gib(self):
        if self.cuda:
            return self.torch.cuda.max_memory_allocated(self.device) / 2**30
        return peak_rss_gib()

    def agree(self, loss, over_cap):
        """All ranks learn whether any got the stop signal or is over the
        memory cap, and the mean loss (one small all-reduce per iteration)."""
        counted = loss is not None and self.tp_rank == 0
        t = self.torch.tensor([float(STOP_REQUESTED[0]), float(over_cap),
                               loss if counted else 0.0, float(counted)],
                              dtype=self.torch.float64, device=self.flag_device)
        self.dist.all_reduce(t)
        stop, oom, loss_sum, n = t.tolist()
        rubick.stop.released(t)  # gloo's thread let go of it: a rank may exit right after
        return stop > 0, oom > 0, (loss_sum / n if n else None)

    # -- checkpoints ----------------------------------------------------------
    def _ckpt_path(self):
        return os.path.join(self.args.checkpoint_dir, CHECKPOINT_FILE)

    def _full_state(self):
        """Full (unsharded) model and optimizer state, keyed by parameter name,
        complete on rank 0 (None elsewhere).  Collective."""
        torch, dist = self.torch, self.dist
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
        if self.zero1:
            self.optimizer.consolidate_state_dict(to=0)
            if self.rank != 0:
                return None, None
            sd = self.optimizer.state_dict()
            names = self.param_names
            optim = {"state": {names[i]: s for i, s in sd["state"].items()},
                     "param_groups": [dict(g, params=[names[i] for i in g["params"]])
                                      for g in sd["param_groups"]]}
            model = {k: v.detach().cpu() for k, v in self.module.state_dict().items()}
            return model, optim
        pp = self.plan["pp"] > 1
        # With PP every stage gathers its own part (cpu_offload would keep it
        # on global rank 0 only), then the stage leaders send theirs to rank 0.
        opts = StateDictOptions(full_state_dict=True, cpu_offload=not pp)
        model, optim = get_state_dict(self.model if not pp else self.module, self.optimizer,
                                      options=opts)
        if not pp:
            return (model, optim) if self.rank == 0 else (None, None)
        to_cpu = lambda v: v.detach().cpu() if torch.is_tensor(v) else v  # noqa: E731
        mine = None
        if self.dp_rank == 0 and self.tp_rank == 0:
            mine = ({k: to_cpu(v) for k, v in model.items()},
                    {"state": {k: {n: to_cpu(v) for n, v in s.items()} for k, s in optim["state"].items()},
                     "param_groups": optim["param_groups"]})
        parts = [None] * self.world if self.rank == 0 else None
        dist.gather_object(mine, parts, dst=0)
        if self.rank != 0:
            return None, None
        model, optim = {}, {"state": {}, "param_groups": None}
        for part in filter(None, parts):
            model.update(part[0])
            optim["state"].update(part[1]["state"])
            if optim["param_groups"] is None:
                optim["param_groups"] = [dict(g, params=list(g["params"])) for g in part[1]["param_groups"]]
            else:
                for mine_g, g in zip(optim["param_groups"], part[1]["param_groups"]):
                    mine_g["params"] += g["params"]
        return model, optim

    def _sharded_state(self):
        """The model and optimizer state as DCP takes it, by parameter name, each
        tensor as this rank holds it (sharded by FSDP or TP, ZeRO-1's optimizer
        states for the parameters this rank owns, replicated otherwise), and the
        optimizer's parameter groups (not saved: the run's own apply).  The
        optimizer's states are created when it has not stepped yet, so that a
        template to load into has them."""
        from torch.distributed.checkpoint.state_dict import _init_optim_state, get_state_dict
        if self.zero1:
            local = self.optimizer.optim  # AdamW over this rank's partition
            _init_optim_state(local)
            names = {id(t): n for n, t in self.module.named_parameters()}
            optim = {names[id(t)]: local.state[t] for g in local.param_groups for t in g["params"]}
            return {"model": self.module.state_dict(), "optim": {"state": optim}}, None
        target = self.model if self.plan["pp"] == 1 else self.module
        model, optim = get_state_dict(target, self.optimizer)
        return {"model": model, "optim": {"state": optim["state"]}}, optim["param_groups"]

    def save_checkpoint(self, iteration):
        if not self.args.checkpoint_dir or self.args.engine == "deepspeed":
            return False
        start = time.perf_counter()
        directory = self.args.checkpoint_dir
        if self.args.checkpoint_format == "sharded":
            state, _ = self._sharded_state()
            rubick.checkpoint.save_sharded(directory, iteration, state, plan_name(self.plan),
                                           extra={"model_config": self.cfg, "seed": self.args.seed})
        else:
            model, optim = self._full_state()
            if self.rank == 0:
                os.makedirs(directory, exist_ok=True)
                state = {"version": 1, "iteration": iteration, "model_config": self.cfg,
                         "plan": plan_name(self.plan), "seed": self.args.seed, "model": model, "optim": optim}
                # Atomic: a kill mid-save leaves the previous one.
                rubick.checkpoint.write_atomic(self._ckpt_path(), lambda f: self.torch.save(state, f))
                rubick.checkpoint.remove_sharded(directory)
            self.dist.barrier()
        if self.rank == 0:
            self.metrics.write({"rubick": 1, "event": "checkpointed", "iter": iteration,
                                "save_s": round(time.perf_counter() - start, 4),
                                "format": self.args.checkpoint_format})
        return True

    def load_checkpoint(self):
        """Resume from RUBICK_CHECKPOINT_DIR when it holds a checkpoint; returns
        the iteration it was saved at (0 without one).  Every rank reads the
        full state and keeps its part, so the plan may differ from the saved one."""
        if not self.args.checkpoint_dir or self.args.engine == "deepspeed":
            return 0
        kind = rubick.checkpoint.latest(self.args.checkpoint_dir)
        if kind is None:
            return 0
        if kind == "sharded":
            return self._load_sharded()
        path = self._ckpt_path()
        start = time.perf_counter()
        torch = self.torch
        ck = torch.load(path, map_location="cpu", weights_only=True)
        if ck.get("model_config") != self.cfg:
            fail(f"checkpoint {path} is of model {ck.get('model_config')}, not {self.cfg}")
        names = set(self.param_names)
        keys = set(self.module.state_dict().keys())
        model = {k: v for k, v in ck["model"].items() if k in keys}
        optim = ck["optim"]
        if self.zero1:
            index = {n: i for i, n in enumerate(self.param_names)}
            sd = {"state": {index[n]: s for n, s in optim["state"].items() if n in index},
                  "param_groups": [dict(g, params=[index[n] for n in g["params"] if n in index])
                                   for g in optim["param_groups"]]}
            self.module.load_state_dict(model)
            self.optimizer.load_state_dict(sd)
        else:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict
            optim = {"state": {n: s for n, s in optim["state"].items() if n in names},
                     "param_groups": [dict(g, params=[n for n in g["params"] if n in names])
                                      for g in optim["param_groups"]]}
            target = self.model if self.plan["pp"] == 1 else self.module
            set_state_dict(target, self.optimizer, model_state_dict=model, optim_state_dict=optim,
                           options=StateDictOptions(full_state_dict=True))
        if self.rank == 0:
            log(f"resumed from {path}: iteration {ck['iteration']} saved at plan {ck['plan']} "
                f"(full, loaded in {time.perf_counter() - start:.2f} s)")
        return int(ck["iteration"])

    def _load_sharded(self):
        directory = self.args.checkpoint_dir
        info = rubick.checkpoint.sharded_info(directory)
        saved_cfg = info.get("extra", {}).get("model_config")
        if saved_cfg != self.cfg:
            fail(f"checkpoint {directory}/{info['path']} is of model {saved_cfg}, not {self.cfg}")
        state, groups = self._sharded_state()
        info = rubick.checkpoint.load_sharded(directory, state)
        if not self.zero1:  # ZeRO-1's tensors were loaded in place
            from torch.distributed.checkpoint.state_dict import set_state_dict
            target = self.model if self.plan["pp"] == 1 else self.module
            set_state_dict(target, self.optimizer, model_state_dict=state["model"],
                           optim_state_dict={"state": state["optim"]["state"], "param_groups": groups})
        if self.rank == 0:
            log(f"resumed from {directory}/{info['path']}: iteration {info['iteration']} saved at plan "
                f"{info['plan']} (sharded, loaded in {info['load_s']:.2f} s)")
        return int(info["iteration"])

    # -- the run ---------------------------------------------------------------
    def run(self):
        args, p = self.args, self.plan
        start = self.load_checkpoint()
        end = start + args.iterations
        if args.total_iterations is not None:
            end = min(end, args.total_iterations)
        if self.rank == 0:
            mode = ("FSDP2" if self.fsdp else "DDP" if self.ddp else
                    "ZeRO-1" if self.zero1 else "manual DP all-reduce" if self.manual_sync else "single")
            if self.schedule is not None:
                mode += f" + PP {self.pp_schedule_name}"
            if p["tp"] > 1:
                mode += " + TP" + (" + SP" if p["sp"] else "")
            if p["recompute"] != "none":
                mode += f" + {p['recompute']} recompute"
            log(f"plan {plan_name(p)} world {self.world} device {self.device} "
                f"parameters {self.parameters_total} data-parallel {mode} "
                f"iterations {start + 1}..{end}")
        iteration = start
        cap = args.max_memory_gib
        while iteration < end:
            iteration += 1
            stats = self.train_iteration(iteration)
            over_cap = bool(cap) and not self.cuda and peak_rss_gib() > cap
            stop, oom, loss = self.agree(stats.pop("loss"), over_cap)
            if oom:
                if self.rank == 0:
                    log(f"peak RSS above the cap of {cap} GiB: out of memory")
                    self.metrics.write({"rubick": 1, "event": "oom"})
                return EXIT_OOM
            if self.rank == 0:
                line = {"rubick": 1, "iter": iteration}
                line.update({k: round(v, 6) for k, v in stats.items() if v is not None})
                line["samples"] = p["global_batch"]
                line["peak_memory_gib"] = round(self.peak_memory_gib(), 4)
                if loss is not None and math.isfinite(loss):
                    line["loss"] = round(loss, 5)
                self.metrics.write(line)
            if stop:
                if self.rank == 0:
                    log(f"stop signal: checkpointing at iteration {iteration}")
                self.save_checkpoint(iteration)
                return EXIT_OK
            if args.checkpoint_every and iteration % args.checkpoint_every == 0 and iteration < end:
                self.save_checkpoint(iteration)
        if iteration > start and not args.no_final_checkpoint:
            self.save_checkpoint(iteration)
        return EXIT_OK


def worker_main(args):
    import torch  # noqa: F401  (imported here: the launcher path does not need it)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    plan = resolve_plan(args, world)
    metrics_path = args.metrics
    trainer = None
    try:
        trainer = Trainer(args, plan)
        code = trainer.run()
    except Exception as exc:  # noqa: BLE001
        if not rubick.is_oom(exc):
            raise
        log(f"out of memory: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
        rubick.oom.report_oom(metrics_path)
        sys.stderr.flush()
        os._exit(EXIT_OOM)  # peers may be blocked in a collective: no teardown
    if code == EXIT_OOM:
        sys.stdout.flush()
        os._exit(EXIT_OOM)
    with contextlib.suppress(Exception):
        trainer.dist.destroy_process_group()
    return code


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv, __doc__.split("\n\n")[0])
    if args.iterations < 0:
        fail("--iterations must be >= 0")
    # A stop once the run is over (rubick signals each of the run's processes, and the
    # launcher relays it too) has nothing left to stop: ignored at the interpreter's
    # exit, where Python would restore its default action and a late stop kill (-10).
    atexit.register(signal.signal, stop_signal(), signal.SIG_IGN)
    if "LOCAL_RANK" not in os.environ and args.nproc_per_node and (
            args.nproc_per_node > 1 or args.nnodes > 1):
        return launch_workers(args, os.path.abspath(__file__))
    # Catch the stop signal before the slow `import torch`: its default action
    # would kill the process.
    signal.signal(stop_signal(), lambda _s, _f: STOP_REQUESTED.__setitem__(0, True))
    if "LOCAL_RANK" in os.environ:
        set_parent_death_signal()
        if os.getppid() == 1:  # the launcher is already gone
            fail("parent launcher exited")
    return worker_main(args)


if __name__ == "__main__":
    sys.exit(main())
