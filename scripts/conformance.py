#!/usr/bin/env python3
"""Runs the authors' own policy code on rounds recorded from our replays.

    python scripts/conformance.py SIA_SIMULATOR_DIR INPUTS.json OUT.json

INPUTS.json is written by `cargo run --release -p rubick-tests --example
record_peer_rounds` (its `policy` says which peer); SIA_SIMULATOR_DIR is the
`sia-simulator/` folder of siasosp23/artifacts (commit aaf7a0d), whose `sia.py`
(`SiaPolicy.optimize`) and `pollux_unaware.py` (`PolluxPolicyUnaware.optimize`, the
Pollux the Sia artifact runs) are imported and called unchanged. What this script
supplies, and only that: their inputs built from ours (each job's goodput over the
artifacts' configurations as our belief predicts it, its age, restarts, restart cost,
allocation and growth bound), the solver (CBC is not on PyPI: cvxpy's HiGHS at the
same relative gap, `sia_solver_thresh`), aliases numpy 2 removed (`np.int`,
`np.float`), and a fixed seed per round for Pollux's genetic algorithm. See
data/conformance/README.md for the commands and what differs by design.

Writes OUT.json: for every round, what their code allocated to each job (node
group and GPUs, or none), their objective and, for Sia, their objective of the
allocation we recorded (`oursObjective`), both as their solver's problem states it.
"""

import contextlib
import io
import json
import math
import os
import sys

import numpy as np

np.int = int  # noqa: the artifacts were written for numpy 1.23
np.float = float

import cvxpy as cp  # noqa: E402


def load_artifacts(path):
    sys.path.insert(0, path)
    import simulator_config  # noqa: F401

    simulator_config.sia_solver_verbose = False
    return simulator_config


CAPTURED = {}
_solve = cp.Problem.solve


def _solve_with_highs(self, *args, **kwargs):
    """Their `problem.solve(solver=cp.CBC, ...)` on HiGHS, at their relative gap."""
    import simulator_config

    if kwargs.get("solver") == cp.CBC:
        kwargs = {
            "solver": cp.HIGHS,
            "verbose": False,
            "mip_rel_gap": simulator_config.sia_solver_thresh,
            "threads": 1,
            "random_seed": 0,
        }
    CAPTURED["problem"] = self
    return _solve(self, *args, **kwargs)


cp.Problem.solve = _solve_with_highs


class RowGoodput:
    """A job's goodput on one node group, as their `speedup_fn.get_goodput(nodes,
    replicas)`: our predicted throughput of `replicas * scale_unit` GPUs."""

    def __init__(self, row, scale_unit):
        self.by_gpus = {gpus: thr for gpus, thr in row}
        self.scale_unit = scale_unit

    def get_goodput(self, num_nodes, num_replicas):
        gpus = np.asarray(num_replicas, dtype=np.int64) * self.scale_unit
        return np.asarray([self.by_gpus.get(int(g), 0.0) for g in gpus.reshape(-1)], dtype=np.float32).reshape(
            gpus.shape
        )


class Obj:
    pass


def cluster_names(doc):
    return [f"g{i}" for i in range(len(doc["cluster"]["nodeGroups"]))]


def cap_gpus(job, max_gpus):
    request = job["job"]["request"]["gpus"]
    return min(max(2 * max_gpus, 1), max(64, request))


def sia_round(doc, rnd, sia):
    groups = doc["cluster"]["nodeGroups"]
    names = cluster_names(doc)
    num_nodes = {c: g["count"] for c, g in zip(names, groups)}
    gpn = {c: g["gpusPerNode"] for c, g in zip(names, groups)}
    with contextlib.redirect_stdout(io.StringIO()):
        policy = sia.SiaPolicy()
        policy.populate_valid_configs(num_nodes, gpn, num_nodes)
    penalties, jobs = {}, {}
    for entry in rnd["jobs"]:
        name, info = entry["name"], doc["jobs"][entry["name"]]
        penalties[name] = info["restartS"]
        j = Obj()
        j.age = rnd["nowS"] - info["job"]["submitTimeS"]
        j.num_restarts = entry["restarts"]
        j.num_migrations = 0
        j.scaling_underway = bool(entry["restoring"]) and entry["current"] is not None
        j.attained_service = entry["attainedGpuS"]
        j.used_gpu_seconds = entry["attainedGpuS"]
        j.wasted_gpu_seconds = 0.0
        cur = entry["current"]
        if info["row"]:
            j.category = "adaptive"
            j.speedup_fn, j.scale_unit, j.max_replicas, j.min_replicas = {}, {}, {}, {}
            for gi, c in enumerate(names):
                row = [(g, t) for (grp, g, t) in info["row"] if grp == gi]
                unit = min((g for g, _ in row), default=1)
                j.scale_unit[c] = unit
                j.min_replicas[c] = 0
                # cluster.py: min(max(2 * max_profiled_replicas, 1), 64) replicas.
                j.max_replicas[c] = min(max(2 * entry["maxGpus"] // unit, 1), 64)
                # No throughput model before its first run (`get_goodput_fn` is None).
                j.speedup_fn[c] = RowGoodput(row, unit) if row and entry["maxGpus"] > 0 else None
            if cur is not None:
                c = names[cur["group"]]
                idx = [k for k, v in policy.idx_to_config_map.items() if v[0] == c and v[2] == cur["gpus"]]
                policy.prev_allocs_v2["adaptive"][name] = idx[0] if idx else None
        else:
            rigid = info["rigid"]
            j.category = "rigid"
            j.max_replicas = {c: rigid["gpus"] for c in names}
            j.min_replicas = {c: 0 for c in names}
            j.scale_unit = {c: 1 for c in names}
            j.speedup_fn = {c: None for c in names}
            j.cluster_throughput_ratios = {
                c: (rigid["throughput"] if gi == rigid["group"] else 1e-9) for gi, c in enumerate(names)
            }
            if cur is not None:
                policy.prev_allocs_v2["rigid"][name] = cur["group"]
        jobs[name] = j
    sia.get_restart_penalty = lambda jobname: penalties[jobname]
    nodes = {
        c: {i: type("Node", (), {"resources": {"nvidia.com/gpu": gpn[c]}})() for i in range(num_nodes[c])}
        for c in names
    }
    prev = {}
    with contextlib.redirect_stdout(io.StringIO()):
        placements = policy.optimize(jobs, nodes, prev)
    problem = CAPTURED["problem"]
    theirs = {}
    for name, (c, gpus) in placements.items():
        theirs[name] = None if c is None else {"group": names.index(c), "gpus": len(gpus)}
    # Their objective of the allocation we recorded: the same problem, our one-hot.
    adaptive = [n for n, j in jobs.items() if j.category != "rigid"]
    rigid = [n for n, j in jobs.items() if j.category == "rigid"]
    ours = {e["name"]: e["ours"] for e in rnd["jobs"]}
    ours_objective = None
    xs = {v.shape: v for v in problem.variables()}
    feasible = True
    saved = {id(v): v.value for v in problem.variables()}
    for jobnames, kind in ((adaptive, "adaptive"), (rigid, "rigid")):
        if not jobnames:
            continue
        width = policy.total_num_configs if kind == "adaptive" else len(names)
        x = np.zeros((len(jobnames), width))
        for i, n in enumerate(jobnames):
            o = ours[n]
            if o is None:
                continue
            if kind == "rigid":
                x[i, o["group"]] = 1
                continue
            idx = [k for k, v in policy.idx_to_config_map.items() if v[0] == names[o["group"]] and v[2] == o["gpus"]]
            if not idx:
                feasible = False
                continue
            x[i, idx[0]] = 1
        xs[(len(jobnames), width)].value = x
    if feasible:
        ours_objective = float(problem.objective.value)
    for v in problem.variables():
        v.value = saved[id(v)]
    return {
        "round": rnd["round"],
        "theirs": theirs,
        "objective": float(problem.value),
        "oursObjective": ours_objective,
        "status": problem.status,
    }


class TableGoodput:
    """A job's goodput as their `GoodputFunction.optimize(num_nodes, num_replicas)`:
    our predicted throughput of that many GPUs spread over that many nodes (one GPU
    per replica; the goodput of a split the nodes cannot hold is that of the same GPUs
    packed)."""

    def __init__(self, table, gpus_per_node):
        self.by_split = {(n, r): t for (_, n, r, t) in table}
        self.gpn = gpus_per_node

    def value(self, n, r):
        n, r = int(n), int(r)
        if r == 0:
            return 0.0
        if r > n * self.gpn:
            n = -(-r // self.gpn)
        return self.by_split.get((n, r), 0.0)

    def base(self, n, r):
        """The fair-share base (`Problem.__init__`, the only call without
        `tune_bsz`): where the job cannot run on its fair share (its layout needs
        more GPUs, or other multiples), its nearest configuration's goodput scaled
        linearly to the fair share; their analytic goodput function is defined
        everywhere."""
        v = self.value(n, r)
        if v > 0:
            return v
        feasible = [(abs(g - int(r)), g, t) for (_, g), t in self.by_split.items() if t > 0]
        if not feasible:
            return 1.0
        _, g, t = min(feasible)
        return t * int(r) / g

    def optimize(self, num_nodes, num_replicas, **kwargs):
        value = self.value if "tune_bsz" in kwargs else self.base
        shape = np.broadcast(num_nodes, num_replicas).shape
        n = np.broadcast_to(num_nodes, shape).reshape(-1)
        r = np.broadcast_to(num_replicas, shape).reshape(-1)
        out = np.asarray([value(a, b) for a, b in zip(n, r)], dtype=np.float64).reshape(shape)
        return (out.item() if out.shape == () else out), None, None


def pollux_round(doc, rnd, pollux, seed):
    from utils import JobInfoUnaware
    from speedup import SpeedupFunction

    groups = doc["cluster"]["nodeGroups"]
    assert len(groups) == 1, "Pollux's harness takes one node group"
    gpn, count = groups[0]["gpusPerNode"], groups[0]["count"]
    nodes = {i: type("Node", (), {"resources": {"nvidia.com/gpu": gpn}, "preemptible": False})() for i in range(count)}
    jobs, base = {}, {}
    for entry in rnd["jobs"]:
        name, info = entry["name"], doc["jobs"][entry["name"]]
        goodput = TableGoodput(info["table"], gpn)
        fn = SpeedupFunction(goodput, tune_bsz=False)
        j = JobInfoUnaware(
            resources={"nvidia.com/gpu": 1},
            speedup_fn=fn,
            creation_timestamp=info["job"]["submitTimeS"],
            attained_service=entry["attainedGpuS"],
            min_replicas=0,
            max_replicas=cap_gpus(info, entry["maxGpus"]),
        )
        j.age = rnd["nowS"] - info["job"]["submitTimeS"]
        j.num_restarts = entry["restarts"]
        jobs[name] = j
        cur = entry["current"]
        if cur is not None:
            # The nodes it runs on, GPUs per node, as recorded.
            base[name] = [n for n, ix in cur["nodes"] for _ in ix]
    np.random.seed(seed)
    with contextlib.redirect_stdout(io.StringIO()):
        allocs, _ = pollux.PolluxPolicyUnaware(p_fairness=-1).optimize(jobs, nodes, base, None)
    theirs = {}
    for name in jobs:
        a = allocs.get(name, [])
        theirs[name] = {"group": 0, "gpus": len(a), "nodes": len(set(a))} if a else None
    # Their objective (`Problem._evaluate`: the power mean of the jobs' scaled
    # speedups) of their allocation and of the one we recorded, placed on the nodes
    # as the simulator placed it (a job we left where it was keeps its nodes).
    order = list(jobs)
    index = {n: i for i, n in enumerate(order)}
    problem = pollux.Problem([jobs[n] for n in order], list(nodes.values()), np.zeros((len(order), count), int), -1)
    problem._base_state = _state(base, index, count)
    ours = {}
    for e in rnd["jobs"]:
        o, cur = e["ours"], e["current"]
        if o is None:
            continue
        if cur is not None and (cur["group"], cur["gpus"]) == (o["group"], o["gpus"]):
            ours[e["name"]] = base[e["name"]]
        else:
            ours[e["name"]] = [k for k, n in enumerate(_packed(o["gpus"], gpn)) for _ in range(n)]
    states = np.stack([_state(allocs, index, count), _state(ours, index, count)])
    for name in jobs:
        if theirs[name] is not None:
            # Restarted in their objective: its replicas per node changed.
            theirs[name]["moved"] = bool(np.any(states[0, index[name]] != problem._base_state[index[name]]))
    out = {}
    problem._evaluate(states.reshape(2, -1), out)
    objective, ours_objective = (-float(v) for v in out["F"][:, 0])
    return {"round": rnd["round"], "theirs": theirs, "objective": objective, "oursObjective": ours_objective}


def _state(allocs, index, count):
    state = np.zeros((len(index), count), dtype=int)
    for name, node_list in allocs.items():
        for node in node_list:
            state[index[name], node] += 1
    return state


def _packed(gpus, gpn):
    """GPUs per node of a packed placement (whole nodes first)."""
    return [gpn] * (gpus // gpn) + ([gpus % gpn] if gpus % gpn else [])


def fail(message):
    print(f"conformance.py: {message}", file=sys.stderr)
    sys.exit(2)


def main():
    if len(sys.argv) != 4:
        fail("usage: " + __doc__.strip().splitlines()[2].strip())
    artifacts, inputs, out = sys.argv[1:]
    if not os.path.isfile(os.path.join(artifacts, "sia.py")):
        fail(f"{artifacts}: no sia.py here (the sia-simulator/ folder of siasosp23/artifacts)")
    load_artifacts(artifacts)
    try:
        with open(inputs) as f:
            doc = json.load(f)
        doc["policy"], doc["cluster"]["nodeGroups"], doc["jobs"], doc["rounds"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        fail(f"{inputs}: not a record_peer_rounds file: {e!r}")
    results = []
    if doc["policy"] == "sia":
        import sia

        for rnd in doc["rounds"]:
            results.append(sia_round(doc, rnd, sia))
    elif doc["policy"] == "pollux":
        import pollux_unaware

        for k, rnd in enumerate(doc["rounds"]):
            results.append(pollux_round(doc, rnd, pollux_unaware, seed=k))
    else:
        fail(f"{inputs}: policy `{doc['policy']}`: expected sia or pollux")
    text = json.dumps({"policy": doc["policy"], "inputs": os.path.basename(inputs), "rounds": results}, indent=1)
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        f.write(text + "\n")
    os.replace(tmp, out)
    print(f"{out}: {len(results)} rounds", file=sys.stderr)


if __name__ == "__main__":
    main()
