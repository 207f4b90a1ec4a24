#!/usr/bin/python3
"""fashion_mlp.py: dsnode's native MLP (784-256-256-10, ReLU) in PyTorch,
trained on Fashion-MNIST under dsnode gossip through dsnode.torch
(--model cnn, or fashion_cnn.py: the native CNN, train.model = cnn).

    dslaunch local -n 4 --config conf/examples/cluster.ini \\
        -- python3 tools/python/examples/fashion_mlp.py --steps 1500

Each process reads its config from $DSNODE_CONFIG (dslaunch writes one per
node); every process starts from the same model (torch seeded with
cluster.seed's value below) and shuffles the data its own way (by
$DSNODE_RANK). It logs as a dsnode node does, and the library prints the
summary line dslaunch collects.

Checkpoints, as `dsnode run` has them: --checkpoint-every N writes
<node.data_dir>/checkpoint.bin every N steps (libdsnode's checkpoint: the
parameters and the engine's gossip state, with the optimizer's state and
this program's data order as its own bytes), --stop-after N pauses after
N steps of this process (a checkpoint, status=paused, exit 0: the run for
a Slurm allocation), and --resume FILE continues from a checkpoint.
"""
import argparse
import os
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))        # the dsnode package
sys.path.insert(0, os.path.join(HERE, "..", ".."))  # tools/: torch_mlp (data, model)

import dsnode.torch  # noqa: E402
from torch_ddp import lr_factor  # noqa: E402
from torch_mlp import MEAN, STD, cnn, load_idx, mlp  # noqa: E402


def main(model_name="mlp"):
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["mlp", "cnn"], default=model_name)
    ap.add_argument("--config", default=None, help="default: $DSNODE_CONFIG")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=1e-4)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--eval-every", type=int, default=500)
    ap.add_argument("--seed", type=int, default=42, help="the same on every process")
    ap.add_argument("--checkpoint-every", type=int, default=0, metavar="N")
    ap.add_argument("--stop-after", type=int, default=0, metavar="N",
                    help="pause after N steps of this process (checkpoint, exit 0)")
    ap.add_argument("--resume", default=None, metavar="FILE")
    a = ap.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    model = cnn() if a.model == "cnn" else mlp("256,256")
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum,
                          weight_decay=a.weight_decay)
    # The data first, as dsnode run loads it before joining: the cluster
    # starts training when every member is ready to.
    d = a.data
    norm = lambda x: (torch.from_numpy(x.astype(np.float32)) / 255.0 - MEAN) / STD
    xtr = norm(load_idx(f"{d}/train-images-idx3-ubyte.gz").reshape(-1, 784))
    ytr = torch.from_numpy(load_idx(f"{d}/train-labels-idx1-ubyte.gz").astype(np.int64))
    xte = norm(load_idx(f"{d}/t10k-images-idx3-ubyte.gz").reshape(-1, 784))
    yte = torch.from_numpy(load_idx(f"{d}/t10k-labels-idx1-ubyte.gz").astype(np.int64))
    if a.model == "cnn":
        xtr, xte = xtr.reshape(-1, 1, 28, 28), xte.reshape(-1, 1, 28, 28)
    overrides = dict(s.split("=", 1) for s in a.set)
    overrides.setdefault("train.steps", str(a.steps))
    gopt = dsnode.torch.GossipOptimizer(opt, model, config=a.config, overrides=overrides,
                                        resume=a.resume)

    lossf = torch.nn.CrossEntropyLoss()

    def evaluate():
        gopt.settle()
        with torch.no_grad():
            out = torch.cat([model(xte[i:i + 500]) for i in range(0, xte.shape[0], 500)])
            return lossf(out, yte).item(), (out.argmax(1) == yte).float().mean().item()

    def lr_at(step):  # warm-up, then cosine to 0 (dsnode's train.lr_schedule)
        return a.lr * lr_factor(step, a.warmup, a.steps)

    g = torch.Generator().manual_seed(a.seed * 1000 + int(os.environ.get("DSNODE_RANK", "0")))
    perm, pos = torch.randperm(xtr.shape[0], generator=g), 0
    if gopt.resumed_extra is not None:  # the data order where the checkpoint left it
        perm, pos = gopt.resumed_extra["perm"], gopt.resumed_extra["pos"]
        g.set_state(gopt.resumed_extra["rng"])
    ckpt = a.checkpoint_every > 0 or a.stop_after > 0 or a.resume is not None

    def checkpoint():
        gopt.checkpoint(extra={"perm": perm, "pos": pos, "rng": g.get_state()})

    acc, window, t_train = -1.0, [], 0.0
    failed = paused = False
    own = 0
    try:
        while gopt.steps_taken < a.steps and not gopt.stopped:
            if a.stop_after > 0 and own >= a.stop_after:
                paused = True
                break
            t0 = time.perf_counter()
            if pos + a.batch > xtr.shape[0]:
                perm, pos = torch.randperm(xtr.shape[0], generator=g), 0
            idx = perm[pos:pos + a.batch]
            pos += a.batch
            for grp in gopt.param_groups:
                grp["lr"] = lr_at(gopt.steps_taken)
            gopt.zero_grad()
            loss = lossf(model(xtr[idx]), ytr[idx])
            loss.backward()
            before = gopt.steps_taken
            gopt.step()
            if gopt.steps_taken == before:
                continue  # a joiner shadowing the cluster: not our step
            own += 1
            window.append(loss.item())
            s = gopt.steps_taken
            gopt.report(sum(window) / len(window), acc, s * a.batch / max(t_train, 1e-9))
            t_train += time.perf_counter() - t0
            if s % 100 == 0:
                window = []
            if s % a.eval_every == 0 or s == a.steps:
                test_loss, acc = evaluate()
                gopt.report_eval(test_loss, acc)
            if a.checkpoint_every > 0 and s % a.checkpoint_every == 0 and s < a.steps:
                checkpoint()
        if (gopt.stopped or paused) and gopt.steps_taken < a.steps:
            test_loss, acc = evaluate()
            gopt.report_eval(test_loss, acc)
        if ckpt:
            checkpoint()
    except Exception as ex:
        print(f"fashion_mlp: {ex}", file=sys.stderr)
        failed = True
    # What the binding costs (dsbench torch reads this line): per training
    # step, its wall time, the time in the engine's calls on this thread,
    # of which the engine waited for rounds, and one ctypes crossing.
    n = max(gopt.steps_taken, 1)
    wait_s = gopt.engine.stats()["wait_s"]
    print(f"fashion_mlp: binding steps={gopt.steps_taken} step_ms={t_train / n * 1e3:.4f} "
          f"engine_ms={gopt.engine_s / n * 1e3:.4f} wait_ms={wait_s / n * 1e3:.4f} "
          f"crossing_us={gopt.crossing_us():.3f}", file=sys.stderr, flush=True)
    sys.exit(gopt.finish(failed=failed, paused=paused and not failed))


if __name__ == "__main__":
    main()
