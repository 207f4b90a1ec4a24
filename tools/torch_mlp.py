#!/usr/bin/python3
"""PyTorch baseline for `dsbench train`: the same MLP (or, with --model cnn,
the CNN of dsnode's train.model = cnn), data, batch and optimizer as one
dsnode CPU node, on one thread. Prints one JSON object:
{"samples_per_s": ..., "test_acc": ..., "steps": ..., "train_s": ...}.

Comparison script only (Debian's python3-torch); dsnode itself has no Python.
"""
import argparse
import gzip
import json
import math
import struct
import sys
import time

import numpy as np
import torch

MEAN, STD = 0.2860, 0.3530


def load_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 8:
        sys.exit(f"{path}: not an unsigned-byte IDX file")
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def init(layer, fan_in, fan_out, relu):
    # Same initialisation rule as dsnode: He-uniform before ReLU,
    # Xavier-uniform otherwise (a conv's fans count its k x k window), zero
    # biases.
    bound = math.sqrt(6.0 / fan_in) if relu else math.sqrt(6.0 / (fan_in + fan_out))
    torch.nn.init.uniform_(layer.weight, -bound, bound)
    torch.nn.init.zeros_(layer.bias)
    return layer


def mlp(hidden):
    sizes = [784] + [int(h) for h in hidden.split(",")] + [10]
    layers = []
    for i in range(len(sizes) - 1):
        last = i == len(sizes) - 2
        layers.append(init(torch.nn.Linear(sizes[i], sizes[i + 1]), sizes[i], sizes[i + 1],
                           not last))
        if not last:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def cnn():
    # conv3x3:32, relu, maxpool2, conv3x3:64, relu, maxpool2, flatten,
    # linear:128, relu, linear:10
    return torch.nn.Sequential(
        init(torch.nn.Conv2d(1, 32, 3, padding=1), 9, 32 * 9, True), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        init(torch.nn.Conv2d(32, 64, 3, padding=1), 32 * 9, 64 * 9, True), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        init(torch.nn.Linear(64 * 7 * 7, 128), 64 * 7 * 7, 128, True), torch.nn.ReLU(),
        init(torch.nn.Linear(128, 10), 128, 10, False))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    ap.add_argument("--hidden", default="256,256")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=1e-4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--schedule", choices=["constant", "cosine"], default="cosine")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    d = a.data
    xtr = load_idx(f"{d}/train-images-idx3-ubyte.gz").reshape(-1, 784)
    ytr = load_idx(f"{d}/train-labels-idx1-ubyte.gz")
    xte = load_idx(f"{d}/t10k-images-idx3-ubyte.gz").reshape(-1, 784)
    yte = load_idx(f"{d}/t10k-labels-idx1-ubyte.gz")
    norm = lambda x: (torch.from_numpy(x.astype(np.float32)) / 255.0 - MEAN) / STD
    xtr, xte = norm(xtr), norm(xte)
    ytr = torch.from_numpy(ytr.astype(np.int64))
    yte = torch.from_numpy(yte.astype(np.int64))

    if a.model == "cnn":
        model = cnn()
        xtr, xte = xtr.reshape(-1, 1, 28, 28), xte.reshape(-1, 1, 28, 28)
    else:
        model = mlp(a.hidden)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum,
                          weight_decay=a.weight_decay)

    lossf = torch.nn.CrossEntropyLoss()
    # dsnode's train.lr_schedule: cosine decay from lr to 0 at the last step.
    sched = None
    if a.schedule == "cosine":
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: 0.5 * (1.0 + math.cos(math.pi * min(s, a.steps) / a.steps)))

    n = xtr.shape[0]
    perm = torch.randperm(n)
    pos = 0
    t0 = time.perf_counter()
    for _ in range(a.steps):
        if pos + a.batch > n:
            perm = torch.randperm(n)
            pos = 0
        idx = perm[pos:pos + a.batch]
        pos += a.batch
        opt.zero_grad(set_to_none=True)
        loss = lossf(model(xtr[idx]), ytr[idx])
        loss.backward()
        opt.step()
        if sched:
            sched.step()
    train_s = time.perf_counter() - t0

    with torch.no_grad():  # in batches of 500, as dsnode evaluates
        good = sum((model(xte[i:i + 500]).argmax(1) == yte[i:i + 500]).sum().item()
                   for i in range(0, xte.shape[0], 500))
        acc = good / xte.shape[0]
    print(json.dumps({"samples_per_s": a.steps * a.batch / train_s, "test_acc": acc,
                      "steps": a.steps, "train_s": train_s, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
