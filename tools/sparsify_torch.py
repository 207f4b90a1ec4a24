#!/usr/bin/python3
"""Baselines for `dsbench sparsify`: exact top-k by magnitude with
torch.topk and numpy.argpartition, on arrays of the sizes dsbench uses and
the same kind of data (Gaussian times per-entry scales over two decades),
on one thread like dsnode's sparsifiers. Prints one JSON object per line:
{"method": ..., "n": ..., "density": ..., "ms": ..., "achieved_density": ...}
with the fastest of --reps calls. The magnitude (abs) is part of each timed
call, as it is of ours.

Comparison script only (Debian's python3-torch / python3-numpy); dsnode
itself has no Python. Run: /usr/bin/python3 tools/sparsify_torch.py
"""
import argparse
import json
import sys
import time

import numpy as np

try:
    import torch
except ImportError:  # numpy alone still gives its rows
    torch = None


def data(n, seed=7):
    rng = np.random.default_rng(seed)
    scale = np.exp(2.3 * ((np.arange(n, dtype=np.uint64) * np.uint64(2654435761)) % np.uint64(1000)) / 1000.0)
    return (rng.standard_normal(n, dtype=np.float32) * np.float32(1e-3) * scale.astype(np.float32)).astype(np.float32)


def best_ms(fn, reps):
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000000,25000000,100000000")
    ap.add_argument("--densities", default="0.001,0.01")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    dens = [float(d) for d in a.densities.split(",")]
    if torch is not None:
        torch.set_num_threads(a.threads)
    for n in sizes:
        x = data(n)
        tx = torch.from_numpy(x) if torch is not None else None
        for d in dens:
            k = max(1, min(n, int(round(d * n))))
            reps = a.reps if n < 50_000_000 else min(a.reps, 2)
            rows = []
            if tx is not None:
                out = {}

                def t_topk():
                    out["i"] = torch.topk(tx.abs(), k, sorted=False).indices

                rows.append(("torch.topk", best_ms(t_topk, reps), out["i"].numel() if "i" in out else 0))
            res = {}

            def n_argp():
                res["i"] = np.argpartition(np.abs(x), n - k)[n - k:]

            rows.append(("numpy.argpartition", best_ms(n_argp, reps), res["i"].size))
            for method, ms, count in rows:
                print(json.dumps({"method": method, "n": n, "density": d, "ms": round(ms, 3),
                                  "achieved_density": count / n}), flush=True)
        del x, tx
    return 0


if __name__ == "__main__":
    sys.exit(main())
