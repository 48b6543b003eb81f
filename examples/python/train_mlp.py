"""A plain PyTorch training loop on Fashion-MNIST, recorded by retrace: the five lines marked
"# retrace" are all it adds (an import, create-or-resume, one call per step, a checkpoint now and
then, an evaluation), and its seeding goes through retrace.seed_all (Python seeds ``random`` and
NumPy from the OS, and the recorder captures every generator). Kill it at any step and run it again: it continues from its newest
checkpoint, and its trace is the bits of an uninterrupted run's (run_example.sh shows it).

    python train_mlp.py RUN_DIR [--steps 60] [--lr 0.05] [--kill-after K]
"""
import argparse
import gzip
import os
import signal

import numpy as np
import torch
from torch import nn

import retrace  # retrace

DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(name):
    with gzip.open(os.path.join(DATA, name), "rb") as f:
        raw = f.read()
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(raw[3])]
    return torch.from_numpy(np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * raw[3]).copy()).view(*dims)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--kill-after", type=int, help="SIGKILL this process after that step (a crash)")
    a = ap.parse_args()
    torch.set_num_threads(1)

    x = (read_idx("train-images-idx3-ubyte.gz").float().div(255).sub(0.2860).div(0.3530)).flatten(1)
    y = read_idx("train-labels-idx1-ubyte.gz").long()
    x_test = (read_idx("t10k-images-idx3-ubyte.gz").float().div(255).sub(0.2860).div(0.3530)).flatten(1)[:2000]
    y_test = read_idx("t10k-labels-idx1-ubyte.gz").long()[:2000]

    retrace.seed_all(7)  # torch's, Python's and NumPy's generators: the recorder captures them all
    model = nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Dropout(0.1), nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=a.steps)
    batches = len(x) // a.batch

    if os.path.exists(os.path.join(a.run_dir, "checkpoints")):  # retrace
        rec = retrace.Recorder.resume(a.run_dir, model, opt, state_objects={"sched": sched})
    else:
        rec = retrace.Recorder.create(a.run_dir, model, opt, seed=7, config={"steps": a.steps, "lr": a.lr, "batch": a.batch},
                                      state_objects={"sched": sched})
    order = torch.randperm(len(x)) if rec.batch_in_epoch == 0 else torch.tensor(rec.data_state["order"])

    for step in range(rec.next_step, a.steps + 1):
        if rec.batch_in_epoch == batches:  # a new epoch: its order from torch's generator
            rec.epoch, rec.batch_in_epoch = rec.epoch + 1, 0
            order = torch.randperm(len(x))
        idx = order[rec.batch_in_epoch * a.batch:(rec.batch_in_epoch + 1) * a.batch]
        model.train()
        loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        norm = nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        rec.step(loss, batch=idx, grad_norm=norm)  # retrace
        sched.step()
        if step % 10 == 0:
            rec.checkpoint(data_state={"order": order.tolist()})  # retrace
        if step == a.kill_after:
            rec.sync()
            os.kill(os.getpid(), signal.SIGKILL)

    model.eval()
    with torch.no_grad():
        out = model(x_test)
        test_loss = nn.functional.cross_entropy(out, y_test).item()
        accuracy = (out.argmax(1) == y_test).float().mean().item()
    rec.evaluate(test_loss, accuracy, samples=len(y_test))  # retrace
    print(f"step {a.steps}: test loss {test_loss:.4f}, accuracy {accuracy:.4f}")


if __name__ == "__main__":
    main()
