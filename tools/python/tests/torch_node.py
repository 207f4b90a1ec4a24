#!/usr/bin/python3
"""torch_node.py: a small PyTorch program under dsnode.torch.GossipOptimizer,
for the tests: an MLP 64-96-80-10 on seeded random data (rank-dependent),
SGD with momentum; model.bin at the end. The process's data and the
initial parameters are the same from run to run, so two runs of a group
that differ only in group.overlap must end byte for byte alike.

    torch_node.py --steps S [--set KEY=VALUE]...
Config: $DSNODE_CONFIG (or --config).
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import dsnode.torch  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=None)
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--mirror", action="store_true",
                    help="the engine works on host mirrors (the GPU path, on the CPU)")
    a = ap.parse_args()
    rank = int(os.environ.get("DSNODE_RANK", "0"))
    torch.set_num_threads(1)
    torch.manual_seed(1)  # the same initial model on every process
    # The middle layer and the last (65,792 + 2,570 floats) fill a bucket
    # of their own with group.overlap (64 Ki floats), so the engine's layer
    # thread reduces them; smaller ones would ride with the first layer.
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10))
    opt = dsnode.torch.GossipOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), model, config=a.config,
        overrides=dict(s.split("=", 1) for s in a.set), mirror=a.mirror or None)
    g = torch.Generator().manual_seed(100 + rank)  # this process's own data
    while opt.steps_taken < a.steps and not opt.stopped:
        x = torch.randn(32, 64, generator=g)
        y = torch.randint(0, 10, (32,), generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.report(loss.item())
    opt.settle()
    print(f"torch_node: layers_handed={opt.layers_handed} adds={opt.adds} "
          f"rounds={opt.engine.stats()['rounds']}", file=sys.stderr, flush=True)
    sys.exit(opt.finish())


if __name__ == "__main__":
    main()
