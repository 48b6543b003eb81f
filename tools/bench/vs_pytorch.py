#!/usr/bin/env python3
"""The PyTorch side of tools/bench/vs-pytorch: retrace's two built-in runs as plain PyTorch loops.

  vs_pytorch.py --model mlp|gpt --steps N --warmup W [--threads T] [--interop-threads I] [...]

Trains N steps of the same model, optimizer, LR schedule, dropout and gradient clipping as
retrace's configs/fashion-mlp.toml and configs/char-gpt.toml, with the data set in memory
as tensors. Each step is timed with time.perf_counter() around all of it (batch gather,
forward, backward, clipping, optimizer step, reading the loss). After the loop it evaluates
once on the test split, as `retrace record` does after its last step, so that the two
processes' wall times compare too. The last line of output is one JSON object:
median_step_ms over the steps after the first W, plus the set-up, loop and eval times and the
thread counts, BLAS and allocator seen at run time.

The arithmetic is the same but for the GPT's GELU, which retrace computes with its own kernel by
default (model.gelu_impl; within a few ulp of PyTorch's, which runs oneDNN's); the random draws
are not: PyTorch's dropout calls its generator once per element, while retrace by default keys a
Philox mask with one draw per dropout call (model.dropout_impl), so the loss curves agree in
distribution, not bit for bit. Run vs-pytorch with --retrace-set model.dropout_impl=torch
--retrace-set model.gelu_impl=torch to compare on LibTorch's own dropout and GELU.

Thread counts: without --threads nothing is set (PyTorch's own defaults). OpenBLAS's pool is
sized from OPENBLAS_NUM_THREADS in the environment, which the caller sets before we start.
"""

import argparse
import ctypes
import gzip
import json
import math
import os
import statistics
import sys
import time

T_START = time.perf_counter()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

FASHION_DIR = "/usr/share/datasets/fashion-mnist"
CORPUS_DIR = "/usr/share/common-licenses"
MEAN, STD = 0.2860, 0.3530


# ---------------------------------------------------------------- data

def read_idx(path, magic):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    got = int.from_bytes(raw[0:4], "big")
    if got != magic:
        raise SystemExit(f"{path}: IDX magic {got:#x}, expected {magic:#x}")
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    return torch.from_numpy(data.copy()).view(*dims)


def load_fashion(split):
    images = read_idx(os.path.join(FASHION_DIR, f"{split}-images-idx3-ubyte.gz"), 0x803)
    labels = read_idx(os.path.join(FASHION_DIR, f"{split}-labels-idx1-ubyte.gz"), 0x801)
    x = images.reshape(images.shape[0], -1).float().div_(255.0).sub_(MEAN).div_(STD)
    return x.contiguous(), labels.long()


def corpus_files(root):
    """Regular files under root (links followed, directory links not entered), sorted by path,
    each target once at its first path."""
    paths = []
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            p = os.path.join(dirpath, name)
            if os.path.isfile(p):
                paths.append(p)
    paths.sort(key=lambda p: p.encode("utf-8", "surrogateescape"))
    seen, unique = set(), []
    for p in paths:
        target = os.path.realpath(p)
        if target not in seen:
            seen.add(target)
            unique.append(p)
    return unique


def load_corpus(context, test_fraction=0.1):
    texts = []
    for p in corpus_files(CORPUS_DIR):
        with open(p, "rb") as f:
            b = f.read()
        if b"\0" in b:
            continue
        texts.append(b)
    text = np.frombuffer(b"\n".join(texts), dtype=np.uint8)
    window = context + 1
    windows = len(text) // window
    vocab = np.unique(text)  # sorted set of bytes
    lookup = np.full(256, -1, dtype=np.int64)
    lookup[vocab] = np.arange(len(vocab))
    tokens = torch.from_numpy(lookup[text[: windows * window]]).view(windows, window)
    n_test = int(math.floor(windows * test_fraction))
    if test_fraction > 0:
        n_test = min(max(n_test, 1), windows - 1)
    n_train = windows - n_test
    inputs, targets = tokens[:, :context], tokens[:, 1:]
    return (inputs[:n_train].contiguous(), targets[:n_train].contiguous(),
            inputs[n_train:].contiguous(), targets[n_train:].contiguous(), len(vocab))


# ---------------------------------------------------------------- models

def mlp(hidden, dropout):
    layers, width = [], 784
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU(), nn.Dropout(dropout)]
        width = h
    layers.append(nn.Linear(width, 10))
    return nn.Sequential(*layers)


class Block(nn.Module):
    def __init__(self, d, heads, dropout, context):
        super().__init__()
        self.heads, self.p = heads, dropout
        self.ln_1 = nn.LayerNorm(d)
        self.attn_qkv = nn.Linear(d, 3 * d)
        self.attn_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp_fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)
        self.register_buffer("future", torch.ones(context, context, dtype=torch.bool).triu(1), persistent=False)

    def forward(self, x):
        b, t, d = x.shape
        dh = d // self.heads
        q, k, v = self.attn_qkv(self.ln_1(x)).split(d, dim=-1)
        q = q.view(b, t, self.heads, dh).transpose(1, 2)
        k = k.view(b, t, self.heads, dh).transpose(1, 2)
        v = v.view(b, t, self.heads, dh).transpose(1, 2)
        att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(dh))
        att = att.masked_fill(self.future[:t, :t], float("-inf"))
        att = F.dropout(torch.softmax(att, dim=-1), self.p, self.training)
        y = torch.matmul(att, v).transpose(1, 2).contiguous().view(b, t, d)
        x = x + F.dropout(self.attn_proj(y), self.p, self.training)
        m = self.mlp_proj(F.gelu(self.mlp_fc(self.ln_2(x))))
        return x + F.dropout(m, self.p, self.training)


class Gpt(nn.Module):
    def __init__(self, vocab, context, d, layers, heads, dropout):
        super().__init__()
        self.p = dropout
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(context, d)
        self.blocks = nn.ModuleList([Block(d, heads, dropout, context) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)
        self.register_buffer("pos", torch.arange(context), persistent=False)
        with torch.no_grad():  # GPT-2 style: N(0, 0.02) matrices, zero biases, LayerNorm at (1, 0)
            for name, w in self.named_parameters():
                if name.endswith("bias"):
                    w.zero_()
                elif w.dim() == 2:
                    w.normal_(0.0, 0.02)

    def forward(self, idx):
        t = idx.shape[1]
        x = F.dropout(self.wte(idx) + self.wpe(self.pos[:t]), self.p, self.training)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


# ---------------------------------------------------------------- loop

def lr_at(step, peak, warmup, total, min_ratio):
    """retrace's schedule: linear warmup over steps 1..warmup, then cosine down to min_ratio x peak."""
    if warmup > 0 and step <= warmup:
        return peak * step / warmup
    if total <= warmup:
        return peak
    progress = min(1.0, max(0.0, (step - warmup) / (total - warmup)))
    return peak * (min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))


def blas_info():
    """The BLAS library mapped into this process, and OpenBLAS's own view of itself."""
    libs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            if "blas" in os.path.basename(path).lower():
                libs.add(path)
    info = {"blas_libs": sorted(libs)}
    for path in sorted(libs):
        try:
            lib = ctypes.CDLL(path)
            lib.openblas_get_config.restype = ctypes.c_char_p
            lib.openblas_get_corename.restype = ctypes.c_char_p
            info["blas"] = lib.openblas_get_config().decode()
            info["blas_core"] = lib.openblas_get_corename().decode()
            info["blas_threads"] = lib.openblas_get_num_threads()
            break
        except (OSError, AttributeError):
            continue
    return info


def allocator():
    with open("/proc/self/maps") as f:
        maps = f.read()
    for name in ("tcmalloc", "jemalloc", "mimalloc"):
        if name in maps:
            return name
    return "glibc"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["mlp", "gpt"], required=True)
    ap.add_argument("--steps", type=int, required=True, help="optimizer steps to run (the schedule's total)")
    ap.add_argument("--warmup", type=int, default=10, help="first steps left out of the median")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave PyTorch's default)")
    ap.add_argument("--interop-threads", type=int, default=0, help="torch.set_num_interop_threads (0: default)")
    ap.add_argument("--batch", type=int, default=0, help="batch size (0: the config's, 128 mlp / 16 gpt)")
    ap.add_argument("--hidden", default="512,256", help="mlp hidden widths")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--no-eval", action="store_true", help="skip the final test evaluation")
    args = ap.parse_args()

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.interop_threads > 0:
        torch.set_num_interop_threads(args.interop_threads)
    torch.manual_seed(args.seed)

    t0 = time.perf_counter()
    if args.model == "mlp":
        batch = args.batch or 128
        x_train, y_train = load_fashion("train")
        x_test, y_test = load_fashion("t10k")
        hidden = [int(h) for h in args.hidden.split(",") if h]
        model = mlp(hidden, 0.1)
        opt_kw = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
        warmup_steps, min_ratio, eval_batch = 100, 0.05, 1000
        describe = "mlp 784-" + "-".join(map(str, hidden)) + "-10"
    else:
        batch = args.batch or 16
        context = 128
        x_train, y_train, x_test, y_test, vocab = load_corpus(context)
        model = Gpt(vocab, context, d=128, layers=8, heads=4, dropout=0.1)
        opt_kw = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
        warmup_steps, min_ratio, eval_batch = 20, 0.1, 64
        describe = f"gpt vocab={vocab} context={context} d_model=128 n_layers=8 n_heads=4"
    setup_s = time.perf_counter() - t0

    params = [p for p in model.parameters()]
    opt = torch.optim.AdamW(params, **opt_kw)
    peak = opt_kw["lr"]
    n_train = x_train.shape[0]
    per_epoch = n_train // batch  # the last partial batch is dropped, as in retrace
    model.train()

    times, losses = [], []
    perm, cursor = None, per_epoch
    t_loop = time.perf_counter()
    for step in range(1, args.steps + 1):
        t = time.perf_counter()
        if cursor == per_epoch:
            perm, cursor = torch.randperm(n_train), 0
        idx = perm[cursor * batch:(cursor + 1) * batch]
        cursor += 1
        xb = x_train.index_select(0, idx)
        yb = y_train.index_select(0, idx)
        lr = lr_at(step, peak, warmup_steps, args.steps, min_ratio)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=True)
        logits = model(xb)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), yb.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(loss.item())
        times.append((time.perf_counter() - t) * 1e3)
    loop_s = time.perf_counter() - t_loop

    eval_s, accuracy = 0.0, None
    if not args.no_eval:
        t = time.perf_counter()
        model.eval()
        correct = 0
        with torch.no_grad():
            for start in range(0, x_test.shape[0], eval_batch):
                logits = model(x_test[start:start + eval_batch])
                targets = y_test[start:start + eval_batch].reshape(-1)
                correct += int((logits.reshape(-1, logits.shape[-1]).argmax(1) == targets).sum())
        accuracy = correct / y_test.numel()
        eval_s = time.perf_counter() - t

    timed = times[args.warmup:] if len(times) > args.warmup else times
    out = {
        "side": "pytorch",
        "model": describe,
        "batch": batch,
        "steps": args.steps,
        "warmup": args.warmup,
        "timed_steps": len(timed),
        "median_step_ms": statistics.median(timed),
        "mean_step_ms": statistics.fmean(timed),
        "loop_ms_per_step": loop_s * 1e3 / args.steps,
        "setup_s": setup_s,
        "eval_s": eval_s,
        "process_s_to_here": time.perf_counter() - T_START,
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "test_accuracy": accuracy,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "env.OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS", ""),
        "env.OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE", ""),
        "allocator": allocator(),
    }
    out.update(blas_info())
    print(json.dumps(out))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
