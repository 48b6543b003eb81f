"""A damaged run directory gives the CLI's clear errors, as Python exceptions of the exit code's class."""
import json
import os

import pytest
import torch

import retrace
from conftest import cli
from loop import MLP, make, train


def shard_of(ckpt):
    files = [f for f in os.listdir(ckpt) if f.endswith(".safetensors")]
    assert files, os.listdir(ckpt)
    return os.path.join(ckpt, sorted(files)[0])


def flip(path, at=-100):
    with open(path, "r+b") as f:
        f.seek(at, os.SEEK_END)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0xFF]))


@pytest.fixture
def run(tmp_path):
    train(tmp_path / "run", 6, checkpoint_every=3)  # checkpoints after steps 3 and 6
    return tmp_path / "run"


def ckpt(run, step):
    return run / "checkpoints" / f"step-{step:08d}"


def test_a_damaged_newest_checkpoint_is_skipped_for_an_older_one(run):
    flip(shard_of(ckpt(run, 6)))
    code, out, err = cli("verify", ckpt(run, 6), check=False)
    assert code == 3
    model, opt = make()
    rec = retrace.Recorder.resume(run, model, opt)
    assert rec.last_step == 3


def test_no_checkpoint_that_verifies_is_an_integrity_error_with_the_cli_code(run):
    for s in (3, 6):
        flip(shard_of(ckpt(run, s)))
    code, _, err = cli("verify", ckpt(run, 3), check=False)
    model, opt = make()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(retrace.IntegrityError) as e:
        retrace.Recorder.resume(run, model, opt)
    assert e.value.exit_code == code == 3
    assert "no checkpoint" in str(e.value) and "verifies" in str(e.value)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # untouched


def test_a_missing_manifest_is_skipped_like_damage(run):
    os.remove(ckpt(run, 6) / "manifest.json")
    code, _, _ = cli("verify", ckpt(run, 6), check=False)
    assert code in (3, 4)
    model, opt = make()
    assert retrace.Recorder.resume(run, model, opt).last_step == 3


def test_another_models_checkpoints_are_refused_naming_the_tensor(run):
    model = MLP(width=48)
    opt = torch.optim.AdamW(model.parameters())
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(retrace.IntegrityError) as e:
        retrace.Recorder.resume(run, model, opt)
    assert e.value.exit_code == 3 and "fc1.weight" in str(e.value)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_another_optimizer_is_a_config_error(run):
    model, opt = make(optim="sgd")
    with pytest.raises(retrace.ConfigError) as e:
        retrace.Recorder.resume(run, model, opt)
    assert e.value.exit_code == 2 and "adamw" in str(e.value)


def test_a_trace_cut_before_the_checkpoint_is_refused(run):
    trace = run / "trace.rtrace"
    size = os.path.getsize(trace)
    with open(trace, "r+b") as f:
        f.truncate(size // 3)
    model, opt = make()
    with pytest.raises(retrace.Error) as e:
        retrace.Recorder.resume(run, model, opt)
    assert e.value.exit_code == 3 and isinstance(e.value, (retrace.IntegrityError, retrace.FormatError))


def test_an_unwritable_place_is_an_environment_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    model, opt = make()
    with pytest.raises(retrace.Error) as e:
        retrace.Recorder.create(blocker / "run", model, opt)
    assert e.value.exit_code == 4 and isinstance(e.value, retrace.IoError), (type(e.value), e.value)


def test_a_resume_without_a_run_is_an_integrity_error(tmp_path):
    model, opt = make()
    with pytest.raises(retrace.IntegrityError) as e:
        retrace.Recorder.resume(tmp_path / "nothing", model, opt)
    assert "there is none" in str(e.value)


def test_a_run_has_one_writer(tmp_path):
    """Issue 54: while a recorder writes a run, another create (even with force), resume or a CLI
    writer (`record --force` into it) is refused with the CLI's exit code 4 naming this process;
    after close() the run continues from its checkpoint."""
    model, opt = make()
    rec = retrace.Recorder.create(tmp_path / "a", model, opt)
    model(torch.ones(4, 16)).sum().backward()
    opt.step()
    rec.step(1.0, batch=[0, 1, 2, 3])
    rec.checkpoint()
    for attempt in (lambda: retrace.Recorder.create(tmp_path / "a", model, opt, force=True),
                    lambda: retrace.Recorder.resume(tmp_path / "a", model, opt)):
        with pytest.raises(retrace.IoError) as e:
            attempt()
        assert e.value.exit_code == 4
        assert "being written by another process" in str(e.value) and f"pid {os.getpid()}" in str(e.value)
    code, _, err = cli("record", "--force", "--steps", "1", "--out", tmp_path / "a", check=False)
    assert code == 4 and f"pid {os.getpid()}" in err, err
    assert (tmp_path / "a" / "trace.rtrace").exists()  # untouched
    code, out, _ = cli("inspect", tmp_path / "a", check=False)  # a reader needs no lock
    assert code == 0, out
    rec.close()
    rec.close()  # again: nothing
    with pytest.raises(retrace.ConfigError):
        rec.step(2.0, batch=[0, 1, 2, 3])
    assert not os.path.exists(tmp_path / "a" / ".retrace-lock")
    again = retrace.Recorder.resume(tmp_path / "a", model, opt)
    assert again.last_step == 1
    again.close()


def test_a_trace_cut_after_a_checkpoint_resumes_from_the_one_before(run):
    """Issue 54: the trace cut short (a full disk, a copy cut off) before the newest checkpoint's
    position: resume passes over that checkpoint for the newest one the intact trace reaches."""
    with open(ckpt(run, 6) / "manifest.json") as f:
        position = json.load(f)["trace_position"]
    os.truncate(run / "trace.rtrace", position - 1)
    model, opt = make()
    rec = retrace.Recorder.resume(run, model, opt)
    assert rec.last_step == 3
    rec.close()
    code, out, _ = cli("inspect", run, "--json", check=False)
    assert code == 0 and json.loads(out[out.index("{"):])["steps"][-1]["step"] == 3
