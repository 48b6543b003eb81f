#!/usr/bin/env python3
"""The Python recorder's cost per step: a plain PyTorch loop without it, with it, with it but no
optimizer digest, and with it overlapped (overlap_digests=True, capture_python_rng="checkpoint"),
alternating A B C D A B C D in one process (docs/performance.md).

    PYTHONPATH=build-torch2/python .venv-torch/bin/python tools/bench/python_recorder_bench.py \
        [--model small|mlp|wide] [--rounds 4] [--steps 150] [--threads 1]

Models: small = examples/python's 784-128-10 MLP; mlp = retrace's default 784-512-256-10; wide =
784-2048-2048-10 (6.2M parameters, where the digests' reads meet the step's own). Each round
trains `steps` steps of SGD with momentum (or --optim adamw) on Fashion-MNIST batches of 64 (data
in memory), each variant from the same initial state, and times every step (forward, backward,
clipping, optimizer step, and the recorder's step call) with perf_counter. Prints per round the
median step of each variant, then the recorder's cost as a fraction of the plain step: the median
over rounds of (with - without) / without, with its spread (min, max). A checkpoint is not part
of a step (it is every N steps by the loop's choice); its time is printed apart.
"""
import argparse
import gzip
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import torch
from torch import nn

import retrace

DATA = "/usr/share/datasets/fashion-mnist"
WIDTHS = {"small": [128], "mlp": [512, 256], "wide": [2048, 2048]}


def read_idx(name):
    with gzip.open(os.path.join(DATA, name), "rb") as f:
        raw = f.read()
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(raw[3])]
    return torch.from_numpy(np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * raw[3]).copy()).view(*dims)


def make(widths, optim):
    retrace.seed_all(7)
    layers, n = [], 784
    for w in widths:
        layers += [nn.Linear(n, w), nn.ReLU()]
        n = w
    model = nn.Sequential(*layers, nn.Linear(n, 10))
    if optim == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return model, opt


def run(variant, widths, optim, x, y, steps, tmp):
    model, opt = make(widths, optim)
    rec = None
    if variant != "plain":
        rec = retrace.Recorder.create(os.path.join(tmp, variant), model, opt, seed=7, force=True,
                                      optimizer_digest_every=0 if variant == "no-optim-digest" else 1,
                                      overlap_digests=variant == "overlapped",
                                      capture_python_rng="checkpoint" if variant == "overlapped" else True)
    times = []
    order = torch.randperm(len(x))
    for step in range(steps):
        idx = order[step * 64:(step + 1) * 64]
        t = time.perf_counter()
        loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        norm = nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if rec is not None:
            rec.step(loss, batch=idx, grad_norm=norm)
        else:
            loss.item()  # the loop reads its loss either way
        times.append(time.perf_counter() - t)
    ckpt = None
    if rec is not None:
        t = time.perf_counter()
        rec.checkpoint()
        ckpt = time.perf_counter() - t
        rec.sync()
    return statistics.median(times[10:]), ckpt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=sorted(WIDTHS), default="small")
    ap.add_argument("--optim", choices=["sgd", "adamw"], default="sgd")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    x = (read_idx("train-images-idx3-ubyte.gz").float().div(255).sub(0.2860).div(0.3530)).flatten(1)
    y = read_idx("train-labels-idx1-ubyte.gz").long()
    widths = WIDTHS[a.model]
    params = sum(p.numel() for p in make(widths, a.optim)[0].parameters())
    print(f"model {a.model} ({params} parameters), {a.optim}, {a.steps} steps x {a.rounds} rounds, "
          f"threads {a.threads}, torch {torch.__version__}")
    variants = ["plain", "recorder", "no-optim-digest", "overlapped"]
    med = {v: [] for v in variants}
    ckpts = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            row = []
            for v in variants:
                m, c = run(v, widths, a.optim, x, y, a.steps, tmp)
                med[v].append(m)
                if c is not None:
                    ckpts.append(c)
                row.append(f"{v} {m * 1e3:.3f} ms")
            print(f"round {r + 1}: " + ", ".join(row))
    for v in variants[1:]:
        costs = [(w - p) / p for w, p in zip(med[v], med["plain"])]
        print(f"{v}: cost {100 * statistics.median(costs):.2f} % of the step "
              f"[{100 * min(costs):.2f}, {100 * max(costs):.2f}]")
    print(f"plain step: median {1e3 * statistics.median(med['plain']):.3f} ms; "
          f"checkpoint: median {1e3 * statistics.median(ckpts):.1f} ms")


if __name__ == "__main__":
    sys.exit(main())
