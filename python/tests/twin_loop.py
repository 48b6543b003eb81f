"""The Python half of the twin test: `retrace record`'s default run (an MLP on Fashion-MNIST), written
as a plain PyTorch loop with retrace.Recorder, op for op as retrace's C++ step computes it.

    python twin_loop.py RUN_DIR STEPS [sgd|adamw]

Run in a fresh process (test_twin.py does): the thread counts are process settings that must be set
before torch does any parallel work, and the numerics fingerprint records them.

SETTINGS is the one source of the run's settings: test_twin.py passes them to `retrace record` as
--set KEY=VALUE, this loop reads the same values. What each C++ piece is, and its Python spelling:

  init      rng::seed_cpu_and_device(seed) then model::MlpImpl (src/train/trainer.cpp initial_state):
            torch's CPU generator set_current_seed(seed), then torch::nn::Linear(784,512),
            Linear(512,256), Linear(256,10) built in that order (kaiming_uniform_ weight, then
            uniform_ bias, each) = torch.manual_seed(seed), then nn.Linear in the same order.
            Nothing else draws from the generator (the sampler is a Feistel bijection, no dropout).
  data      data/fashion_mnist.cpp: uint8 -> float32, div_(255), sub_(0.2860f), div_(0.3530f);
            batch b of epoch 0 = data_order(seed, 60000, 0)[b*B:(b+1)*B], gathered by index_select.
  forward   relu between the Linear layers (model/mlp.cpp; model.dropout = 0: no dropout call).
  loss      train/step.cpp: cross_entropy(reduction=sum) * (1.0 / B) (a double scalar), item() as
            float32 (the step's total is 0 + loss, the same bits).
  backward  loss.backward() with the gradients set to None first (zero_grad(set_to_none)).
  norm      train/step.cpp global_grad_norm: each gradient's at::norm(grad, 2) (aten::norm.Scalar,
            called directly; Python's Tensor.norm goes through torch.functional.norm to
            linalg_vector_norm, measured to give the same bits here), stacked in parameter order,
            norm(2) again, item<float>() widened to double. The MLP has < 1M floats,
            so the C++ lanes are not used (kAfterBackwardLanesFrom).
  clip      clip_coef = max_norm / (norm + 1e-6) in double; if < 1 every gradient mul_(clip_coef)
            (a double scalar); the norm after = norm * clip_coef (computed, not measured).
            torch.nn.utils.clip_grad_norm_ is not this arithmetic (foreach norms, a float32 tensor
            coefficient clamped to 1), so the loop spells it out.
  lr        train/schedule.cpp lr_at(step): linear warmup peak * step / warmup, then the cosine to
            min_lr_ratio over the remaining steps (train.steps) with std::cos = math.cos.
  optimizer LibTorch's torch::optim::SGD (momentum, L2 weight decay, no dampening, no Nesterov) =
            torch.optim.SGD(foreach=False): the single-tensor path spells the same ops
            (grad.add(param, alpha=wd); buf = clone(grad) / buf.mul_(m).add_(grad, alpha=1);
            param.add_(buf, alpha=-lr)).
  adamw     (the second twin) LibTorch's AdamW with optim.adamw_moment = "lerp" (train/optimizer.cpp
            LerpAdamW) = torch.optim.AdamW(foreach=False): param.mul_(1 - lr * wd);
            exp_avg.lerp_(grad, 1 - beta1); exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2);
            denom = (exp_avg_sq.sqrt() / bias_correction2 ** 0.5).add_(eps);
            param.addcdiv_(exp_avg, denom, value=-lr / bias_correction1). optim.fused = false (the
            fused kernel computes the moment as mul_ then add_).
  threads   runtime.threads = blas_threads = interop_threads = 1 (MKL runs on torch's threads);
            deterministic algorithms on; oneDNN on (numerics native).
"""
import gzip
import math
import os
import struct
import sys

import numpy as np
import torch
from torch import nn

SEED = 1234
BATCH = 32
DATA_DIR = "/usr/share/datasets/fashion-mnist"
LR = 0.05
WARMUP = 3
MIN_LR_RATIO = 0.05
MAX_NORM = 1.0
MOMENTUM = 0.9
WEIGHT_DECAY = 0.01
HIDDEN = (512, 256)

# retrace record's keys for the same run: every one the loop below depends on, plus the ones that
# keep retrace record from doing what a plain loop does not (evaluation, checkpoints, the spike
# guard). test_twin.py passes them as --set KEY=VALUE; the Recorder stores them as its config.
SETTINGS = {
    "seed": SEED,
    "data.kind": "fashion-mnist",
    "data.dir": DATA_DIR,
    "data.batch_size": BATCH,
    "data.order": "feistel",
    "data.last_batch": "drop",
    "model.kind": "mlp",
    "model.hidden": list(HIDDEN),
    "model.activation": "relu",
    "model.dropout": 0.0,
    "optim.name": "sgd",
    "optim.lr": LR,
    "optim.momentum": MOMENTUM,
    "optim.nesterov": False,
    "optim.weight_decay": WEIGHT_DECAY,
    "schedule.kind": "cosine",
    "schedule.warmup_steps": WARMUP,
    "schedule.min_lr_ratio": MIN_LR_RATIO,
    "train.max_norm": MAX_NORM,
    "train.accum_steps": 1,
    "amp.mode": "off",
    "guards.spike_factor": 0.0,
    "runtime.device": "cpu",
    "runtime.numerics": "native",
    "runtime.threads": 1,
    "runtime.blas_threads": 1,
    "runtime.interop_threads": 1,
    "runtime.deterministic": True,
    "runtime.invariance": "none",
    "trace.digest_version": 4,
    "trace.optimizer_digest_every": 1,
    "checkpoint.every_steps": 0,
    "checkpoint.at_end": False,
    "eval.each_epoch": False,
}


# The AdamW twin: the same run with torch.optim.AdamW (LibTorch's AdamW with PyTorch 2.x's lerp_).
BETAS = (0.9, 0.999)
EPS = 1e-8
ADAMW_WEIGHT_DECAY = 0.01
ADAMW_SETTINGS = {**SETTINGS, "optim.name": "adamw", "optim.fused": False, "optim.adamw_moment": "lerp",
                  "optim.beta1": BETAS[0], "optim.beta2": BETAS[1], "optim.eps": EPS,
                  "optim.weight_decay": ADAMW_WEIGHT_DECAY}


def settings_of(optimizer):
    return ADAMW_SETTINGS if optimizer == "adamw" else SETTINGS


def cli_settings(optimizer="sgd"):
    """SETTINGS (or ADAMW_SETTINGS) as retrace record's --set arguments."""
    def text(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, list):
            return "[" + ", ".join(map(str, v)) + "]"
        return str(v)
    out = []
    for k, v in settings_of(optimizer).items():
        out += ["--set", f"{k}={text(v)}"]
    return out


def nested_settings(optimizer="sgd"):
    """The settings as a nested dict (the Recorder's config: config.toml reads like retrace record's)."""
    out = {}
    for k, v in settings_of(optimizer).items():
        *tables, key = k.split(".")
        d = out
        for t in tables:
            d = d.setdefault(t, {})
        d[key] = v
    return out


# kMean, kStd of data/fashion_mnist.cpp, as the float32 values the C++ float literals are
MEAN = float(np.float32(0.2860))
STD = float(np.float32(0.3530))


def read_idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    rank = raw[3]
    dims = struct.unpack(">" + "I" * rank, raw[4:4 + 4 * rank])
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * rank).reshape(dims)


def load_train():
    img = read_idx(os.path.join(DATA_DIR, "train-images-idx3-ubyte.gz"))
    lbl = read_idx(os.path.join(DATA_DIR, "train-labels-idx1-ubyte.gz"))
    x = torch.from_numpy(img.reshape(len(img), 28 * 28).copy()).to(torch.float32).div_(255.0).sub_(MEAN).div_(STD)
    y = torch.from_numpy(lbl.copy()).to(torch.int64)
    return x, y


class MLP(nn.Module):
    """model/mlp.cpp's MlpImpl: a ModuleList `layers` of Linear, relu between them."""

    def __init__(self, inputs=784, hidden=HIDDEN, outputs=10):
        super().__init__()
        self.layers = nn.ModuleList()
        for width in hidden:
            self.layers.append(nn.Linear(inputs, width))
            inputs = width
        self.layers.append(nn.Linear(inputs, outputs))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i + 1 < len(self.layers):
                x = torch.relu(x)
        return x


def lr_at(step, total_steps):
    """train/schedule.cpp LrSchedule::lr_at, in the same double arithmetic."""
    if WARMUP > 0 and step <= WARMUP:
        return LR * float(step) / float(WARMUP)
    if total_steps <= WARMUP:
        return LR
    progress = float(step - WARMUP) / float(total_steps - WARMUP)
    progress = min(1.0, max(0.0, progress))
    m = MIN_LR_RATIO
    return LR * (m + (1.0 - m) * 0.5 * (1.0 + math.cos(math.pi * progress)))


def global_grad_norm(params):
    norms = [torch.ops.aten.norm.Scalar(p.grad, 2) for p in params if p.grad is not None]
    return torch.ops.aten.norm.Scalar(torch.stack(norms), 2).item()


def pin_process():
    torch.set_num_interop_threads(1)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)


def train(run_dir, steps, optimizer="sgd"):
    import retrace

    x_all, y_all = load_train()
    torch.manual_seed(SEED)
    model = MLP()
    params = list(model.parameters())
    if optimizer == "adamw":
        opt = torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=ADAMW_WEIGHT_DECAY,
                                foreach=False)
    else:
        opt = torch.optim.SGD(params, lr=LR, momentum=MOMENTUM, dampening=0, nesterov=False,
                              weight_decay=WEIGHT_DECAY, foreach=False)
    rec = retrace.Recorder.create(run_dir, model, opt, seed=SEED, config=nested_settings(optimizer),
        description="twin of retrace record's MLP", capture_python_rng=False, digest_version=4,
        module_digests=False)
    order = retrace.data_order(SEED, len(y_all), 0, "feistel")
    assert steps * BATCH <= len(order), "the twin stays within epoch 0"
    for b in range(steps):
        step = b + 1
        idx = torch.tensor(order[b * BATCH:(b + 1) * BATCH], dtype=torch.int64)
        x, y = x_all.index_select(0, idx), y_all.index_select(0, idx)
        lr = lr_at(step, steps)
        for g in opt.param_groups:
            g["lr"] = lr
        model.train()
        for p in params:
            p.grad = None
        loss = nn.functional.cross_entropy(model(x), y, reduction="sum") * (1.0 / BATCH)
        loss_value = torch.zeros((), dtype=torch.float32).add(loss.detach())  # the C++ step's total
        loss.backward()
        norm = global_grad_norm(params)
        post = norm
        coef = MAX_NORM / (norm + 1e-6)
        if MAX_NORM > 0 and coef < 1.0:
            with torch.no_grad():
                for p in params:
                    if p.grad is not None:
                        p.grad.mul_(coef)
            post = norm * coef
        opt.step()
        # epoch / batch_in_epoch: the batch's own position, recorded as retrace record records it;
        # the position after it (b + 1) is the cursor both put into the RNG digest
        rec.step(loss_value, batch=idx, lr=lr, grad_norm=norm, grad_norm_clipped=post, epoch=0,
                 batch_in_epoch=b)
    rec.sync()


if __name__ == "__main__":
    pin_process()
    train(sys.argv[1], int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "sgd")
