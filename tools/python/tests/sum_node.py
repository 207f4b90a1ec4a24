#!/usr/bin/python3
"""sum_node.py: a dsnode program without a model, for the tests: N floats
that start equal on every process, each step drifting by this process's
own pattern (rank-dependent), mixed by the engine. When the config
averages gradients (node.group, or topology allreduce) the drift is the
"gradient": the engine averages it over the group before it is applied.
Writes model.bin at the end (dsnode_leave) and exits with the engine's exit
status.

    sum_node.py --steps S --n N [--pause SECONDS] [--set KEY=VALUE]...
Config: $DSNODE_CONFIG (or --config).
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import dsnode  # noqa: E402


def drift(rank, n):
    """This process's change per step (the test computes the same)."""
    return (0.001 * (rank + 1) * (1 + np.arange(n) % (5 + rank))).astype(np.float32)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=None)
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--pause", type=float, default=0.0, help="compute time per step")
    a = ap.parse_args()
    rank = int(os.environ.get("DSNODE_RANK", "0"))
    buf = (1 + np.arange(a.n) % 7).astype(np.float32)
    d = drift(rank, a.n)
    e = dsnode.Engine(config=a.config, overrides=dict(s.split("=", 1) for s in a.set),
                      handle_signals=True)
    half = a.n // 2

    def adopt(step):  # a late joiner took the cluster's state at `step`
        print(f"sum_node: adopted step={step}", file=sys.stderr, flush=True)

    grad = np.zeros(a.n, dtype=np.float32) if e.reduces else None
    if grad is not None:
        e.register_grad(grad)
    e.register(buf, [("a", 0, half), ("b", half, a.n - half)], adopt=adopt)
    e.join()
    while e.stats()["step"] < a.steps and not e.stopped:
        if not e.ready():
            continue
        if grad is not None:
            grad[:] = d
            e.reduce()  # the group's mean drift
            buf += grad
        else:
            buf += d
        if a.pause:
            time.sleep(a.pause)
        e.step()
        e.report(0.0)
    e.leave()
    status = e.exit_status
    e.close()
    sys.exit(status)


if __name__ == "__main__":
    main()
