"""The twin: `retrace record` (C++) and a plain PyTorch loop with retrace.Recorder (twin_loop.py),
the same model, data, order and settings, give the same trace fields step for step, bit for bit.

The run (twin_loop.SETTINGS, passed to retrace record as --set): retrace's default MLP 784-512-256-10
(relu) on Fashion-MNIST, seed 1234, batches of 32 in the Feistel order of epoch 0
(retrace.data_order), 8 steps; SGD with momentum 0.9 and L2 weight decay 0.01 (or AdamW, below);
LR 0.05 with a 3-step linear warmup then the cosine to 5 % (so the LR changes every step); gradients clipped to
norm 1.0 (every step clips); trace.digest_version 4; numerics native, 1 torch / BLAS / inter-op
thread, deterministic algorithms on, in both processes. The two traces' numerics fingerprints
must be equal (the same LibTorch, CPU level, BLAS, threads): otherwise the tests skip, naming the
keys (e.g. RETRACE_BIN built against LibTorch 1.13 while Python has torch 2.x).

Settings chosen so a plain loop can match (what retrace record does that Python does not):
  model.dropout = 0     retrace's dropout (model.dropout_impl philox, or torch) draws from torch's
                        CPU generator inside forward(); nn.Dropout draws other numbers, so the
                        parameters and the RNG digest would part at step 1.
  optimizer             two twins: SGD (torch::optim::SGD against torch.optim.SGD), and AdamW with
                        optim.adamw_moment = "lerp" and optim.fused = false (LibTorch's AdamW with
                        PyTorch 2.x's exp_avg.lerp_(grad, 1 - beta1), train/optimizer.cpp LerpAdamW)
                        against torch.optim.AdamW(foreach=False). retrace's default AdamW computes
                        exp_avg.mul_(beta1).add_(grad, 1 - beta1): other bits from step 2 on.
  guards.spike_factor = 0, eval and checkpoints off: policies a plain loop does not have (they
                        change no step's arithmetic here, only what retrace record does around it).
The loop spells out retrace's clipping (a double coefficient; torch.nn.utils.clip_grad_norm_ uses a
float32 tensor coefficient: other gradient bits from step 1) and its global norm; twin_loop.py's
docstring maps every C++ piece to its Python spelling.

Compared step by step from `retrace export --jsonl` and equal: step, epoch, batch_in_epoch,
batch_size, sample_digest, loss, loss_bits, lr, grad_norm_pre, grad_norm_post, outcome,
skip_reason, loss_scale, micro_batch_sizes, micro_losses, param_digest, grad_digest, optim_digest,
rng_digest. The RNG digest can be equal: retrace record's (train/state.cpp rng_state) is torch's CPU
generator, the seed and the data cursor after the step, with no named Philox streams; the
Recorder's (api/recorder.cpp rng_bytes, capture_python_rng=False) is the same bytes: the loop
passes the batch's position, and the recorder's cursor after the step is the next batch's.

Fields that differ by design, not compared:
  content_digest, chain_digest  hashes of the whole record and of the chain: they differ because
                                the fields below do.
  state_digest                  retrace record's policy state (loss scaler, skip and spike guards,
                                fired faults, set-aside batches, samples seen); the Recorder has
                                none and writes zero.
  timings                       wall clock (the Recorder writes zero).
  module_digests                retrace record writes none; the twin's Recorder is created with
                                module_digests=False so that both rows have the same shape.
"""
import json
import os
import subprocess
import sys

import pytest

from conftest import HERE, cli, cli_json
import twin_loop

STEPS = 8

COMPARED = ("step", "epoch", "batch_in_epoch", "batch_size", "sample_digest", "loss", "loss_bits", "lr",
            "grad_norm_pre", "grad_norm_post", "outcome", "skip_reason", "loss_scale", "micro_batch_sizes",
            "micro_losses", "param_digest", "grad_digest", "optim_digest", "rng_digest")
DIGESTS = ("sample_digest", "param_digest", "grad_digest", "optim_digest", "rng_digest")
# what `retrace diff` may name between the twins (the docstring says why each differs)
BY_DESIGN = {"content_digest", "chain_digest", "state_digest"}
ZERO = "0" * 32


def is_numerics_key(key):  # records::is_numerics_key
    return not key.startswith(("info.", "env.")) and key not in ("allocator", "cuda_device_count")


def export(run):
    _, out, _ = cli("export", run, "--jsonl")
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    return rows[0], [r for r in rows if r.get("type") == "step"]


@pytest.fixture(scope="module", params=["sgd", "adamw"])
def twins(request, tmp_path_factory):
    optimizer = request.param
    base = tmp_path_factory.mktemp("twin-" + optimizer)
    cpp, py = base / "cpp", base / "py"
    cli("record", "--steps", STEPS, "--out", cpp, *twin_loop.cli_settings(optimizer))
    p = subprocess.run([sys.executable, os.path.join(HERE, "twin_loop.py"), str(py), str(STEPS), optimizer],
                       capture_output=True, text=True)
    assert p.returncode == 0, f"twin_loop.py exited {p.returncode}:\n{p.stdout}\n{p.stderr}"
    header_c, steps_c = export(cpp)
    header_p, steps_p = export(py)
    assert [r["step"] for r in steps_c] == list(range(1, STEPS + 1))
    assert [r["step"] for r in steps_p] == list(range(1, STEPS + 1))
    return {"optimizer": optimizer, "cpp": cpp, "py": py, "header_c": header_c, "header_p": header_p, "steps_c": steps_c,
            "steps_p": steps_p}


@pytest.fixture(scope="module")
def same_numerics(twins):
    """Skips (naming the keys) unless the two traces' numerics fingerprints are equal."""
    fp = {}
    for side in ("cpp", "py"):
        _, j = cli_json("inspect", twins[side] / "trace.rtrace", "--json")
        fp[side] = {k: v for k, v in j["header"]["fingerprint"].items() if is_numerics_key(k)}
    differing = sorted(k for k in set(fp["cpp"]) | set(fp["py"]) if fp["cpp"].get(k) != fp["py"].get(k))
    if differing:
        pytest.skip("the twins' numerics fingerprints differ, no bitwise promise: " +
                    ", ".join(f"{k} ({fp['cpp'].get(k)!r} vs {fp['py'].get(k)!r})" for k in differing))
    return twins


def test_headers_describe_the_same_model(same_numerics):
    c, p = same_numerics["header_c"], same_numerics["header_p"]
    assert c["params"] == p["params"]  # names, dtypes and shapes, in order
    assert [x["name"] for x in c["params"]] == ["layers.0.weight", "layers.0.bias", "layers.1.weight",
                                                "layers.1.bias", "layers.2.weight", "layers.2.bias"]
    assert c["seed"] == p["seed"] == twin_loop.SEED


def test_every_step_is_bitwise_the_same(same_numerics):
    sc, sp = same_numerics["steps_c"], same_numerics["steps_p"]
    # the run exercises what it claims: the LR changes, clipping scales, digests are real
    assert len({r["lr"] for r in sc}) == STEPS
    assert all(r["grad_norm_post"] < r["grad_norm_pre"] for r in sc)
    assert all(not r.get("module_digests") for r in sc + sp)
    mismatches = []
    for c, p in zip(sc, sp):
        for f in DIGESTS:
            assert c[f] != ZERO, f"retrace record's step {c['step']} has no {f}"
        for f in COMPARED:
            if c[f] != p[f]:
                mismatches.append(f"step {c['step']} {f}: retrace record {c[f]!r}, Recorder {p[f]!r}")
    assert not mismatches, "\n".join(mismatches)


def test_retrace_diff_finds_only_the_fields_that_differ_by_design(same_numerics):
    code, j = cli_json("diff", same_numerics["cpp"] / "trace.rtrace", same_numerics["py"] / "trace.rtrace", "--json",
                       check=False)
    assert code in (0, 1), j
    assert j["environment_differs"] is False
    assert set(j["first_divergence_by_field"]) <= BY_DESIGN, j["first_divergence_by_field"]


def test_batch_position_as_retrace_record(same_numerics):
    sc, sp = same_numerics["steps_c"], same_numerics["steps_p"]
    assert [r["batch_in_epoch"] for r in sc] == list(range(STEPS))
    assert [(r["epoch"], r["batch_in_epoch"]) for r in sp] == [(r["epoch"], r["batch_in_epoch"]) for r in sc]


def test_adamw_twin_needs_lerp(same_numerics, tmp_path):
    """Negative control for the AdamW twin: retrace's default first moment (mul_add) is not
    torch.optim.AdamW's, and the comparison sees it (from step 2 on)."""
    if same_numerics["optimizer"] != "adamw":
        pytest.skip("the SGD twin")
    args = twin_loop.cli_settings("adamw")
    args[args.index("optim.adamw_moment=lerp")] = "optim.adamw_moment=mul_add"
    cli("record", "--steps", STEPS, "--out", tmp_path / "muladd", *args)
    _, steps_m = export(tmp_path / "muladd")
    sp = same_numerics["steps_p"]
    assert any(m["param_digest"] != p["param_digest"] for m, p in zip(steps_m, sp))
