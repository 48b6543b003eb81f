"""The Python recorder: create, step, checkpoint, resume (bitwise), evaluate, and the CLI on its runs."""
import json
import os
import random

import numpy as np
import pytest
import torch

import retrace
from conftest import cli, cli_json, run_loop
from loop import MLP, make, train


def steps_of(run):
    code, out, err = cli("export", run, "--jsonl")
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    return [r for r in rows if r.get("type") == "step"]


def test_create_lays_out_a_run_the_cli_reads(tmp_path):
    run = tmp_path / "run"
    data_file = tmp_path / "data.bin"
    data_file.write_bytes(b"\x01" * 1000)
    model, opt = make()
    rec = retrace.Recorder.create(run, model, opt, seed=7, config={"lr": 0.01, "model": {"width": 32}},
                                  data_files=[data_file])
    assert (run / "config.toml").exists() and (run / "trace.rtrace").exists()
    text = (run / "config.toml").read_text()
    assert "lr = 0.01" in text and "[model]" in text and "digest_version = 4" in text
    _, j = cli_json("inspect", run / "trace.rtrace", "--json")
    names = [p["name"] for p in j["header"]["params"]]
    assert names == [n for n, _ in model.named_parameters()] + [n for n, _ in model.named_buffers()]
    files = j["header"]["data_files"]
    assert files[0]["size"] == 1000  # std::filesystem inside python: libstdc++'s, not libtorch's copy
    assert rec.last_step == 0 and rec.next_step == 1
    rec.close()  # a live recorder's directory is refused for its lock (IoError); a finished run for existing
    with pytest.raises(retrace.ConfigError) as e:
        retrace.Recorder.create(run, model, opt)
    assert e.value.exit_code == 2 and str(run) in str(e.value)


def test_steps_record_digests_per_module_and_must_increase(tmp_path):
    rec, model, opt = train(tmp_path / "a", 5)
    rows = steps_of(tmp_path / "a")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    zero = "0" * 32
    for r in rows:
        assert r["param_digest"] != zero and r["grad_digest"] != zero and r["optim_digest"] != zero
        assert [m["module"] for m in r["module_digests"]] == ["fc1", "norm", "fc2"]
    assert rows[0]["lr"] == 1e-2 and rows[4]["lr"] == 5e-3  # the scheduler's halving after step 4
    assert rows[0]["batch_size"] == 16
    with pytest.raises(retrace.ConfigError) as e:
        rec.step(torch.tensor(1.0), step=3)
    assert "steps must increase" in str(e.value)


def test_two_equal_loops_are_identical_and_a_changed_module_is_named(tmp_path):
    train(tmp_path / "a", 6)
    train(tmp_path / "b", 6)
    code, out, _ = cli("diff", tmp_path / "a" / "trace.rtrace", tmp_path / "b" / "trace.rtrace")
    assert code == 0 and "IDENTICAL" in out
    # one hyperparameter of one module: fc2's learning rate
    train(tmp_path / "c", 6, fc2_lr=2e-2)
    code, j = cli_json("diff", tmp_path / "a" / "trace.rtrace", tmp_path / "c" / "trace.rtrace", "--json", check=False)
    assert code == 1
    w = j["where"]
    assert w["step"] == 1 and w["phase"] == "optimizer" and w["module"] == "fc2", w
    assert "param" in w["parts"] and w["modules_differing"] == 1
    code, out, _ = cli("diff", tmp_path / "a" / "trace.rtrace", tmp_path / "c" / "trace.rtrace", check=False)
    assert "module fc2" in out


def test_checkpoint_verifies_and_rotates(tmp_path):
    train(tmp_path / "a", 12, checkpoint_every=2)  # 6 checkpoints, 5 kept
    ckpts = sorted(os.listdir(tmp_path / "a" / "checkpoints"))
    steps = [c for c in ckpts if c.startswith("step-")]
    assert len(steps) == 5 and steps[-1] == "step-00000012"
    cli("verify", tmp_path / "a" / "checkpoints" / steps[-1])


def test_resume_after_a_kill_is_bitwise_the_uninterrupted_run(tmp_path):
    train(tmp_path / "a", 10)
    p = run_loop(tmp_path / "b", 10, "--kill-after", 7)
    assert p.returncode == -9, p.stderr
    p = run_loop(tmp_path / "b", 10, "--resume")
    assert p.returncode == 0, p.stderr
    code, out, _ = cli("diff", tmp_path / "a" / "trace.rtrace", tmp_path / "b" / "trace.rtrace", check=False)
    # the resume event is a process event; steps, evals and everything else are equal
    assert code == 0 and "IDENTICAL" in out, out
    assert (tmp_path / "b" / "trace.set-aside.rtrace").exists()  # step 7, after the checkpoint at 6
    a, b = steps_of(tmp_path / "a"), steps_of(tmp_path / "b")
    for ra, rb in zip(a, b):
        for f in ("loss_bits", "param_digest", "grad_digest", "optim_digest", "rng_digest", "chain_digest"):
            assert ra[f] == rb[f], (ra["step"], f)


def test_overlapped_digests_record_the_same_bits_through_a_kill(tmp_path):
    train(tmp_path / "a", 10)
    train(tmp_path / "b", 10, overlap=True)
    code, out, _ = cli("diff", tmp_path / "a", tmp_path / "b", check=False)
    assert code == 0 and "IDENTICAL" in out, out
    p = run_loop(tmp_path / "c", 10, "--kill-after", 7, "--overlap")
    assert p.returncode == -9, p.stderr
    p = run_loop(tmp_path / "c", 10, "--resume", "--overlap")
    assert p.returncode == 0, p.stderr
    code, out, _ = cli("diff", tmp_path / "a", tmp_path / "c", check=False)
    assert code == 0 and "IDENTICAL" in out, out


def test_resume_restores_every_generator_and_the_data_position(tmp_path):
    model, opt = make()
    rec = retrace.Recorder.create(tmp_path / "a", model, opt)
    x = torch.randn(4, 16)
    model(x).sum().backward()
    opt.step()
    rec.step(1.0, batch=[0, 1, 2, 3], epoch=2, batch_in_epoch=5)
    rec.checkpoint(data_state={"cursor": [2, 5]})
    rec.close()  # one writer per run: the first recorder lets go before the run is resumed
    draws = (torch.rand(3), random.random(), np.random.rand(2))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    model2, opt2 = make(seed=99)
    torch.manual_seed(1), random.seed(1), np.random.seed(1)
    rec2 = retrace.Recorder.resume(tmp_path / "a", model2, opt2)
    assert rec2.last_step == 1 and (rec2.epoch, rec2.batch_in_epoch) == (2, 6) and rec2.samples_seen == 4
    assert rec2.data_state == {"cursor": [2, 5]}
    again = (torch.rand(3), random.random(), np.random.rand(2))
    assert torch.equal(draws[0], again[0]) and draws[1] == again[1] and np.array_equal(draws[2], again[2])
    for k, v in model2.state_dict().items():
        assert torch.equal(v, state[k]), k
    for p, q in zip(model.parameters(), model2.parameters()):
        for f in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(opt.state[p][f], opt2.state[q][f])
        assert float(opt.state[p]["step"]) == float(opt2.state[q]["step"])


def test_evaluate_and_events_reach_the_trace(tmp_path):
    rec, model, opt = train(tmp_path / "a", 3)
    rec.event("note", "hello")
    rec.sync()
    _, j = cli_json("inspect", tmp_path / "a" / "trace.rtrace", "--json")
    assert j["evals"][0]["step"] == 3 and j["evals"][0]["accuracy"] == 0.5
    assert any(e["kind"] == "note" and e["message"] == "hello" for e in j["events"])
    with pytest.raises(retrace.ConfigError):
        rec.event("resume", "retrace's own kind")


def test_other_optimizers_are_recorded_without_their_state(tmp_path):
    model = MLP()
    opt = torch.optim.Adagrad(model.parameters())
    rec = retrace.Recorder.create(tmp_path / "a", model, opt)
    model(torch.randn(2, 16)).sum().backward()
    opt.step()
    rec.step(0.5)
    with pytest.raises(retrace.ConfigError) as e:
        rec.checkpoint()
    assert "AdamW or SGD" in str(e.value)
    with pytest.raises(retrace.ConfigError):
        retrace.Recorder.create(tmp_path / "b", model, torch.optim.AdamW(model.parameters(), amsgrad=True))
