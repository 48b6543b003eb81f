"""A plain PyTorch training loop with retrace's lines, for the tests (and their subprocesses).

    python loop.py RUN_DIR STEPS [--resume] [--kill-after K] [--lr LR] [--optim adamw|sgd]
"""
import argparse
import os
import random
import signal

import numpy as np
import torch
from torch import nn

import retrace


class MLP(nn.Module):
    def __init__(self, width=32):
        super().__init__()
        self.fc1 = nn.Linear(16, width)
        self.norm = nn.LayerNorm(width)
        self.fc2 = nn.Linear(width, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.norm(self.fc1(x))))


N = 256
BATCH = 16


def data():
    g = torch.Generator().manual_seed(123)
    x = torch.randn(N, 16, generator=g)
    y = torch.randint(0, 4, (N,), generator=g)
    return x, y


def make(optim="adamw", lr=1e-2, fc2_lr=None, seed=7):
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    model = MLP()
    if fc2_lr is None:
        groups = model.parameters()
    else:
        groups = [{"params": [p for n, p in model.named_parameters() if not n.startswith("fc2.")]},
                  {"params": model.fc2.parameters(), "lr": fc2_lr}]
    if optim == "adamw":
        opt = torch.optim.AdamW(groups, lr=lr, weight_decay=0.01)
    else:
        opt = torch.optim.SGD(groups, lr=lr, momentum=0.9)
    return model, opt


def batches_of_epoch(epoch):
    # the data order: a permutation drawn from torch's CPU generator (captured and restored by retrace)
    return torch.randperm(N).split(BATCH)


def train(run_dir, steps, resume=False, kill_after=None, checkpoint_every=3, optim="adamw", lr=1e-2,
          fc2_lr=None, extra_noise=True, overlap=False):
    model, opt = make(optim, lr, fc2_lr)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    x, y = data()
    if resume:
        rec = retrace.Recorder.resume(run_dir, model, opt, state_objects={"sched": sched}, overlap_digests=overlap)
        order = [torch.tensor(b) for b in rec.data_state["order"]]
    else:
        rec = retrace.Recorder.create(run_dir, model, opt, seed=7, config={"lr": lr, "optim": {"name": optim}},
                                      state_objects={"sched": sched}, overlap_digests=overlap)
        order = list(batches_of_epoch(0))
    step = rec.next_step
    while step <= steps:
        if rec.batch_in_epoch >= len(order):
            rec.epoch += 1
            rec.batch_in_epoch = 0
            order = list(batches_of_epoch(rec.epoch))
        idx = order[rec.batch_in_epoch]
        # random draws that the loop depends on: Python's and NumPy's generators are captured too
        noise = 1e-3 * random.random() + 1e-3 * float(np.random.rand()) if extra_noise else 0.0
        out = model(x[idx] + noise)
        loss = nn.functional.cross_entropy(out, y[idx])
        opt.zero_grad()
        loss.backward()
        norm = nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        rec.step(loss, batch=idx, grad_norm=norm)
        sched.step()
        if step % checkpoint_every == 0:
            rec.checkpoint(data_state={"order": [b.tolist() for b in order]})
        if kill_after is not None and step == kill_after:
            rec.sync()
            os.kill(os.getpid(), signal.SIGKILL)
        step += 1
    rec.evaluate(loss.item(), 0.5, samples=N)
    rec.sync()
    return rec, model, opt


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("steps", type=int)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--kill-after", type=int)
    ap.add_argument("--optim", default="adamw")
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--fc2-lr", type=float)
    ap.add_argument("--overlap", action="store_true")
    a = ap.parse_args()
    train(a.run_dir, a.steps, a.resume, a.kill_after, optim=a.optim, lr=a.lr, fc2_lr=a.fc2_lr, overlap=a.overlap)
