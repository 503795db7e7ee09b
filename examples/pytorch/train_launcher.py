"""The reference workload's built-in launcher (examples/pytorch/train.py imports it):
one worker process per local rank, in the launcher's process group, each `script`
started again with the same arguments; the stop signal, TERM and INT are relayed to
every worker, a worker that fails stops the others, and the exit status says why
(out of memory and a bad plan first). Also the stop signal the contract names and the
parent-death signal every worker sets.
"""

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time

import rubick.plan
from train_args import EXIT_BAD, EXIT_OK, EXIT_OOM, fail, log, resolve_plan


def stop_signal():
    try:
        return rubick.plan.stop_signal()
    except rubick.PlanError as e:
        fail(str(e))


def set_parent_death_signal(sig=signal.SIGKILL):
    """Die with the parent (torchrun starts workers in their own sessions, so a
    kill of the launcher's process group would otherwise orphan them)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, int(sig), 0, 0, 0)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def launch_workers(args, script):
    n, nnodes = args.nproc_per_node, args.nnodes
    if args.node_rank is None:
        if nnodes > 1:
            fail("--nnodes > 1 needs --node-rank (or RUBICK_NODE_RANK / NODE_RANK); "
                 "or launch with torchrun --rdzv-backend=c10d")
        args.node_rank = 0
    if not 0 <= args.node_rank < nnodes:
        fail(f"node rank {args.node_rank} is not in 0..{nnodes - 1}")
    world = n * nnodes
    resolve_plan(args, world)  # bad plans fail here once, with status 2
    port = args.master_port or (free_port() if nnodes == 1 else 29500)
    procs = []
    stop_sig = stop_signal()

    def forward(signum, _frame):
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signum)

    for sig in {stop_sig, signal.SIGTERM, signal.SIGINT}:
        signal.signal(sig, forward)
    for local_rank in range(n):
        env = dict(os.environ, RANK=str(args.node_rank * n + local_rank), LOCAL_RANK=str(local_rank),
                   WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(n), GROUP_RANK=str(args.node_rank),
                   MASTER_ADDR=args.master_addr, MASTER_PORT=str(port), RUBICK_WORKER="1")
        procs.append(subprocess.Popen([sys.executable, script, *sys.argv[1:]],
                                      env=env, preexec_fn=set_parent_death_signal))
    codes = {}
    failed_at = None
    while len(codes) < len(procs):
        for i, proc in enumerate(procs):
            if i not in codes and proc.poll() is not None:
                codes[i] = proc.returncode
                if proc.returncode != 0 and failed_at is None:
                    failed_at = time.monotonic()
                    log(f"worker {i} exited with {proc.returncode}; stopping the others")
                    for other in procs:
                        if other.poll() is None:
                            other.terminate()
        if failed_at is not None and time.monotonic() - failed_at > 20:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
        time.sleep(0.1)
    values = list(codes.values())
    for code in (EXIT_OOM, EXIT_BAD):
        if code in values:
            return code
    bad = [c for c in values if c != 0]
    if not bad:
        return EXIT_OK
    return 128 - bad[0] if bad[0] < 0 else bad[0]
