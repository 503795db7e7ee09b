"""The reference workload's command line and plan (examples/pytorch/train.py imports
them): its arguments, with the RUBICK_* environment as their defaults, and the plan they
name with RUBICK_PLAN, resolved once and checked against the world size, the model and
the global batch (a bad plan exits 2 before torch loads); the log and exit helpers the
workload shares.
"""

import argparse
import os
import sys

import rubick  # train.py makes the checkout's package importable when it is not installed

EXIT_OK, EXIT_BAD, EXIT_OOM = 0, 2, rubick.EXIT_OOM


def log(msg):
    rank = os.environ.get("RANK", "-")
    print(f"[train.py rank {rank}] {msg}", file=sys.stderr, flush=True)


def fail(msg, code=EXIT_BAD):
    log(f"error: {msg}")
    sys.exit(code)


def env_int(name, default=None):
    value = os.environ.get(name, "")
    if value == "":
        return default
    try:
        return int(value)
    except ValueError:
        fail(f"{name}={value!r} is not an integer")


def parse_args(argv, description):
    p = argparse.ArgumentParser(description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    plan = p.add_argument_group("plan (default: RUBICK_* environment, then RUBICK_PLAN)")
    plan.add_argument("--dp", type=int)
    plan.add_argument("--tp", type=int)
    plan.add_argument("--pp", type=int)
    plan.add_argument("--zero", type=int, choices=[0, 1, 2, 3])
    plan.add_argument("--offload", choices=["none", "optimizer", "all"])
    plan.add_argument("--ga", type=int)
    plan.add_argument("--gc", type=int, choices=[0, 1])
    plan.add_argument("--recompute", choices=["none", "selective", "full"])
    plan.add_argument("--sp", type=int, choices=[0, 1])
    plan.add_argument("--vp", type=int)
    plan.add_argument("--micro-batch", type=int)
    plan.add_argument("--pp-schedule", choices=["auto", "gpipe", "1f1b"], default="auto",
                      help="auto: 1F1B when GA >= PP, else GPipe")
    model = p.add_argument_group("model (defaults: ~0.93 M parameters)")
    model.add_argument("--layers", type=int, default=4)
    model.add_argument("--hidden", type=int, default=128)
    model.add_argument("--heads", type=int, default=4)
    model.add_argument("--seq-len", type=int, default=64)
    model.add_argument("--vocab", type=int, default=512)
    model.add_argument("--global-batch", type=int,
                       help="when given, dp*micro_batch*ga must equal it; "
                            "without a micro batch: micro_batch = global_batch/(dp*ga) (default 16)")
    run = p.add_argument_group("run")
    run.add_argument("--iterations", type=int, default=env_int("RUBICK_ITERATIONS", 20),
                     help="iterations this run makes (env RUBICK_ITERATIONS, default 20); "
                          "numbering continues after a resume")
    run.add_argument("--total-iterations", type=int, default=env_int("RUBICK_TOTAL_ITERATIONS"),
                     help="stop at this global iteration (env RUBICK_TOTAL_ITERATIONS)")
    run.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    run.add_argument("--precision", choices=["auto", "fp32", "bf16"], default="auto",
                     help="auto: bf16 autocast on GPU, fp32 on CPU")
    run.add_argument("--engine", choices=["torch", "deepspeed"], default="torch")
    run.add_argument("--lr", type=float, default=1e-3)
    run.add_argument("--seed", type=int, default=1234)
    run.add_argument("--max-memory-gib", type=float,
                     default=float(os.environ.get("RUBICK_MAX_MEMORY_GIB") or 0) or None,
                     help="memory cap: GPU memory fraction, or peak RSS per process on CPU "
                          "(env RUBICK_MAX_MEMORY_GIB)")
    run.add_argument("--cpus", type=int, default=env_int("RUBICK_CPUS"),
                     help="CPU cores of the job (env RUBICK_CPUS); torch threads = cpus/local ranks")
    run.add_argument("--metrics", default=os.environ.get("RUBICK_METRICS") or None,
                     help="metric file (env RUBICK_METRICS; default stdout)")
    run.add_argument("--checkpoint-dir", default=os.environ.get("RUBICK_CHECKPOINT_DIR") or None)
    run.add_argument("--checkpoint-every", type=int, default=0,
                     help="also checkpoint every N iterations (0: only at a stop and at the end)")
    run.add_argument("--no-final-checkpoint", action="store_true")
    run.add_argument("--checkpoint-format", choices=["sharded", "full"],
                     default=os.environ.get("RUBICK_CHECKPOINT_FORMAT") or "sharded",
                     help="sharded: DCP, each rank its shards (default); full: gathered on "
                          "rank 0 into one file (env RUBICK_CHECKPOINT_FORMAT)")
    launch = p.add_argument_group("built-in launcher (instead of torchrun)")
    launch.add_argument("--nproc-per-node", type=int,
                        help="start this many workers on this node (ignored inside torchrun)")
    launch.add_argument("--nnodes", type=int, default=1)
    launch.add_argument("--node-rank", type=int,
                        default=env_int("RUBICK_NODE_RANK", env_int("NODE_RANK")),
                        help="this node's rank (env RUBICK_NODE_RANK or NODE_RANK); "
                             "required with --nnodes > 1")
    launch.add_argument("--master-addr", default="127.0.0.1")
    launch.add_argument("--master-port", type=int, default=0, help="0: a free port")
    return p.parse_args(argv)


OFFLOAD_NAMES = {"none": "none", "optimizer": "optimizer", "offopt": "optimizer",
                 "all": "all", "optimizer+params": "all", "offall": "all"}


def parse_plan_string(text):
    """`dp2-tp1-pp1-mb4-ga2-z1-offopt-gc` -> the fields it names (`rubick.PlanFields`)."""
    try:
        return rubick.parse_plan(text)
    except rubick.PlanError as e:
        fail(str(e))


def same(key, raw, said):
    """Whether a RUBICK_<FIELD> value says what the plan string says (malformed values
    are reported where they are parsed)."""
    r = raw.strip().lower()
    if key in ("gc", "sp"):
        return (r in ("1", "true", "yes")) == bool(said) or r not in ("1", "true", "yes", "0", "false", "no")
    if key == "recompute":
        return r == said
    if key == "offload":
        return OFFLOAD_NAMES.get(r, said) == said
    try:
        return int(r) == int(said)
    except ValueError:
        return True


def resolve_plan(args, world):
    plan_text = os.environ.get("RUBICK_PLAN", "").strip()
    # A complete plan string (the launcher's form) also says ZeRO 0, no offload and no
    # checkpointing by leaving them out: parse_plan fills those in.
    from_plan = parse_plan_string(plan_text)

    def pick(key, env, default):
        value = getattr(args, key)
        said = getattr(from_plan, key)
        if value is None:
            raw = os.environ.get(env, "")
            if raw != "":
                value = raw
                if said is not None and not same(key, raw, said):
                    fail(f"{env}={raw} contradicts RUBICK_PLAN={plan_text} ({key} {said}): "
                         "the per-field variable and the plan string must name the same plan")
        if value is None:
            value = default if said is None else said
        return value

    plan = {}
    for key, env in (("tp", "RUBICK_TP"), ("pp", "RUBICK_PP"), ("ga", "RUBICK_GA"),
                     ("zero", "RUBICK_ZERO"), ("gc", "RUBICK_GC"), ("sp", "RUBICK_SP"), ("vp", "RUBICK_VP")):
        raw = pick(key, env, {"tp": 1, "pp": 1, "ga": 1, "zero": 0, "gc": 0, "sp": 0, "vp": 1}[key])
        if key in ("gc", "sp") and str(raw).lower() in ("true", "false", "yes", "no"):
            raw = int(str(raw).lower() in ("true", "yes"))
        try:
            plan[key] = int(raw)
        except ValueError:
            fail(f"plan field {key}={raw!r} is not an integer")
    dp = pick("dp", "RUBICK_DP", None)
    plan["dp"] = int(dp) if dp is not None else max(1, world // (plan["tp"] * plan["pp"]))
    offload = str(pick("offload", "RUBICK_OFFLOAD", "none")).lower()
    if offload not in OFFLOAD_NAMES:
        fail(f"offload {offload!r} is not one of none|optimizer|all")
    plan["offload"] = OFFLOAD_NAMES[offload]
    recompute = str(pick("recompute", "RUBICK_RECOMPUTE", "none")).lower()
    if recompute not in ("none", "selective", "full"):
        fail(f"recompute {recompute!r} is not one of none|selective|full")
    if plan["gc"] and recompute == "selective":
        fail("gc 1 (full recompute) contradicts recompute selective")
    plan["recompute"] = "full" if plan["gc"] else recompute
    plan["gc"] = int(plan["recompute"] == "full")
    mb = pick("micro_batch", "RUBICK_MICRO_BATCH", None)
    global_batch = args.global_batch
    if mb is None:
        global_batch = global_batch or 16
        if global_batch % (plan["dp"] * plan["ga"]):
            fail(f"global batch {global_batch} is not divisible by dp*ga = {plan['dp'] * plan['ga']}")
        mb = global_batch // (plan["dp"] * plan["ga"])
    plan["micro_batch"] = int(mb)

    for key in ("dp", "tp", "pp", "ga", "micro_batch", "vp"):
        if plan[key] < 1:
            fail(f"plan field {key} must be >= 1, got {plan[key]}")
    if plan["zero"] not in (0, 1, 2, 3):
        fail(f"zero must be 0..3, got {plan['zero']}")
    if plan["sp"] not in (0, 1):
        fail(f"sp must be 0 or 1, got {plan['sp']}")
    if plan["sp"] and plan["tp"] == 1:
        fail("sequence parallelism (sp) needs tp > 1")
    if plan["vp"] > 1 and plan["pp"] == 1:
        fail(f"virtual pipeline stages (vp {plan['vp']}) need pp > 1")
    if plan["vp"] > 1 and plan["ga"] % plan["pp"]:
        fail(f"an interleaved pipeline needs ga ({plan['ga']}) to be a multiple of pp ({plan['pp']})")
    if plan["vp"] > 1 and args.layers % (plan["pp"] * plan["vp"]):
        fail(f"pp*vp = {plan['pp'] * plan['vp']} must divide the {args.layers} layers")
    if plan["offload"] != "none" and plan["zero"] == 0:
        fail("offload needs ZeRO (zero >= 1)")
    if plan["offload"] == "all" and plan["zero"] != 3:
        fail("offload of parameters (all) needs zero = 3")
    gb = plan["dp"] * plan["micro_batch"] * plan["ga"]
    if global_batch is not None and gb != global_batch:
        fail(f"dp*micro_batch*ga = {gb} != global batch {global_batch}")
    product = plan["dp"] * plan["tp"] * plan["pp"]
    if product != world:
        fail(f"plan dp*tp*pp = {plan['dp']}*{plan['tp']}*{plan['pp']} = {product} "
             f"does not match the world size {world} (number of processes)")
    if args.heads % plan["tp"] or (4 * args.hidden) % plan["tp"]:
        fail(f"tp {plan['tp']} must divide heads {args.heads} and 4*hidden {4 * args.hidden}")
    if args.hidden % args.heads:
        fail(f"heads {args.heads} must divide hidden {args.hidden}")
    if plan["pp"] > args.layers:
        fail(f"pp {plan['pp']} exceeds the number of layers {args.layers}")
    plan["global_batch"] = gb
    return plan


def plan_name(plan):
    s = "dp{dp}-tp{tp}-pp{pp}-mb{micro_batch}-ga{ga}".format(**plan)
    s += f"-vp{plan['vp']}" if plan["vp"] > 1 else ""
    s += "-z{zero}".format(**plan)
    s += {"none": "", "optimizer": "-offopt", "all": "-offall"}[plan["offload"]]
    s += "-sp" if plan["sp"] else ""
    return s + {"none": "", "selective": "-sel", "full": "-gc"}[plan["recompute"]]
