#!/usr/bin/python3
"""PyTorch DistributedDataParallel (gloo) baseline for `dsbench cluster`.

N processes on this host train the same MLP as dsnode (784-256-256-10, He /
Xavier uniform initialisation, batch 64 per process, SGD with momentum 0.9
and weight decay 1e-4) with dsnode's learning-rate schedule (train.lr reached
by a linear warm-up over --warmup steps, then cosine decay to 0 at --steps;
the same formula as node/train/train.c, ds_trainer_lr), each process on its own
shuffle, averaging gradients with gloo's dense all-reduce every step: the
AllReduce-SGD that dsnode's gossip is compared with.

Rank 0 evaluates on the 10k test images after every --eval-every steps (the
other ranks wait for it in the next all-reduce, as they would in a real DDP
job). Times are wall clock from the first step (after a barrier that follows
data loading and process-group setup), to the END of an evaluation, as for
dsnode's eval lines; the evaluation time itself is also summed so that it
can be taken out.

--netns NAME,NAME,... puts rank r in network namespace NAME[r] (the
namespaces dsbench made, as dslaunch --netns makes them for dsnode, each
behind its rate-limited link): the worker enters it (setns) before it
creates any socket, rank 0's store listens at --master-addr, and gloo
uses the namespace's --ifname (eth0). So DDP crosses the same links as
the dsnode rows it is compared with.

Prints one JSON object on stdout:
  {"nodes", "steps", "batch", "time_to_target_s", "train_to_target_s",
   "steps_to_target", "final_acc", "samples_per_s", "wall_s", "eval_s",
   "evals": [[step, seconds, acc], ...]}
time_to_target_s (and the others *_target) are null when the target was not
reached. Exits non-zero when a worker fails (the others are then stopped).
Comparison script only (Debian's python3-torch); dsnode itself has no Python.
"""
import argparse
import ctypes
import json
import math
import os
import queue
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_mlp import load_idx, MEAN, STD  # noqa: E402


def build(hidden):
    sizes = [784] + hidden + [10]
    layers = []
    for i in range(len(sizes) - 1):
        lin = torch.nn.Linear(sizes[i], sizes[i + 1])
        last = i == len(sizes) - 2
        # dsnode's rule: He-uniform before ReLU, Xavier-uniform at the output.
        bound = math.sqrt(6.0 / sizes[i]) if not last else math.sqrt(6.0 / (sizes[i] + sizes[i + 1]))
        torch.nn.init.uniform_(lin.weight, -bound, bound)
        torch.nn.init.zeros_(lin.bias)
        layers.append(lin)
        if not last:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def lr_factor(s, warmup, total):
    """dsnode's ds_trainer_lr / train.lr at 0-based step s."""
    if warmup > 0 and s < warmup:
        return (s + 1) / warmup
    if total > warmup:
        p = (s - warmup) / (total - warmup)
        return 0.0 if p >= 1 else 0.5 * (1.0 + math.cos(math.pi * p))
    return 1.0


CLONE_NEWNET = 0x40000000


def enter_netns(name):
    """Move this thread (the process's only one so far that matters: the
    store's and gloo's threads are made after this) into the named network
    namespace, as `ip netns exec` would."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(os.path.join("/run/netns", name), os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into network namespace {name}: {os.strerror(err)}")
    finally:
        os.close(fd)


def worker(rank, a, port, out):
    try:
        if a.netns:
            enter_netns(a.netns.split(",")[rank])
            os.environ["GLOO_SOCKET_IFNAME"] = a.ifname
        os.environ["MASTER_ADDR"] = a.master_addr
        os.environ["MASTER_PORT"] = str(port)
        torch.set_num_threads(1)
        dist.init_process_group("gloo", rank=rank, world_size=a.nodes)
        d = a.data
        norm = lambda x: (torch.from_numpy(x.astype("float32")) / 255.0 - MEAN) / STD
        xtr = norm(load_idx(f"{d}/train-images-idx3-ubyte.gz").reshape(-1, 784))
        ytr = torch.from_numpy(load_idx(f"{d}/train-labels-idx1-ubyte.gz").astype("int64"))
        xte = norm(load_idx(f"{d}/t10k-images-idx3-ubyte.gz").reshape(-1, 784))
        yte = torch.from_numpy(load_idx(f"{d}/t10k-labels-idx1-ubyte.gz").astype("int64"))
        torch.manual_seed(a.seed)  # DDP also broadcasts rank 0's model at wrap time
        model = torch.nn.parallel.DistributedDataParallel(
            build([int(h) for h in a.hidden.split(",")]))
        opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum,
                              weight_decay=a.weight_decay)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: lr_factor(s, a.warmup, a.steps))
        lossf = torch.nn.CrossEntropyLoss()
        g = torch.Generator()
        g.manual_seed(a.seed * 1000 + rank)
        n = xtr.shape[0]
        perm, pos = torch.randperm(n, generator=g), 0
        dist.barrier()
        t0 = time.perf_counter()
        hit = None
        acc, eval_s, evals = 0.0, 0.0, []
        for step in range(1, a.steps + 1):
            if pos + a.batch > n:
                perm, pos = torch.randperm(n, generator=g), 0
            idx = perm[pos:pos + a.batch]
            pos += a.batch
            opt.zero_grad(set_to_none=True)
            lossf(model(xtr[idx]), ytr[idx]).backward()
            opt.step()
            sched.step()
            if rank == 0 and (step % a.eval_every == 0 or step == a.steps):
                te = time.perf_counter()
                with torch.no_grad():
                    acc = (model.module(xte).argmax(1) == yte).float().mean().item()
                now = time.perf_counter()
                eval_s += now - te
                evals.append([step, round(now - t0, 4), round(acc, 4)])
                if hit is None and acc >= a.target:
                    hit = (step, now - t0, now - t0 - eval_s)
        wall = time.perf_counter() - t0
        if rank == 0:
            out.put({"nodes": a.nodes, "steps": a.steps, "batch": a.batch,
                     "time_to_target_s": hit[1] if hit else None,
                     "train_to_target_s": hit[2] if hit else None,
                     "steps_to_target": hit[0] if hit else None,
                     "final_acc": acc, "samples_per_s": a.steps * a.batch * a.nodes / wall,
                     "wall_s": wall, "eval_s": eval_s, "evals": evals})
        dist.destroy_process_group()
    except Exception as e:  # reported by the parent, which stops the others
        out.put({"error": f"rank {rank}: {type(e).__name__}: {e}"})
        raise


def free_port():
    """A port that was free on 127.0.0.1 a moment ago (the kernel's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--hidden", default="256,256")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=1e-4)
    ap.add_argument("--warmup", type=int, default=0, help="linear warm-up steps (train.warmup_steps)")
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--target", type=float, default=0.85)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--port", type=int, default=0, help="0: a free one")
    ap.add_argument("--timeout", type=float, default=1800, help="give up after this many seconds")
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--netns", default="", help="NAME,NAME,...: rank r runs in namespace NAME[r]")
    ap.add_argument("--master-addr", default="127.0.0.1", help="rank 0's address")
    ap.add_argument("--ifname", default="eth0", help="gloo's interface inside --netns")
    a = ap.parse_args()
    if a.nodes < 1 or a.steps < 1 or a.batch < 1 or a.eval_every < 1:
        ap.error("--nodes, --steps, --batch and --eval-every must be >= 1")
    if a.netns and len(a.netns.split(",")) != a.nodes:
        ap.error("--netns needs one namespace name per rank (--nodes)")
    port = a.port or free_port()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, a, port, out)) for r in range(a.nodes)]
    for p in procs:
        p.start()
    res, deadline = None, time.monotonic() + a.timeout
    # Wait for rank 0's result, but not for a dead worker: its peers would
    # block in the all-reduce for ever.
    while res is None and time.monotonic() < deadline:
        try:
            res = out.get(timeout=0.5)
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in procs):
                break
    for p in procs:
        p.join(timeout=30 if res and "error" not in res else 0.1)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    if res is None or "error" in res:
        why = res["error"] if res else ("timeout" if time.monotonic() >= deadline else
                                        "a worker died: exit codes %s" % [p.exitcode for p in procs])
        print(f"torch_ddp.py: failed: {why}", file=sys.stderr)
        sys.exit(1)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
