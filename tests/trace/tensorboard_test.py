"""TensorBoard export, read back by TensorBoard's own reader.

    .venv/bin/python tests/trace/tensorboard_test.py RETRACE_BIN

Records a 100-step run with skips (nan-loss, inf-grad), a spike rollback and two evaluations, live
view on (`record --tensorboard`), then `export --tensorboard`. TensorBoard's EventAccumulator (the
reader its server uses) must return, for every tag, exactly the values and steps that
`retrace inspect --json` gives, in trace order; every record's framing CRCs are checked with
TensorBoard's own masked CRC32C; the live file must hold the same values as the export; and the
export's bad input (non-empty directory without --force, damaged trace, missing trace) must fail
with the documented exit codes, losing nothing.
"""

import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile

from tensorboard.backend.event_processing import plugin_event_accumulator as pea
from tensorboard.compat.tensorflow_stub import pywrap_tensorflow
from tensorboard.util import tensor_util

# The trace's byte layout (resolved before the test changes directory).
LAYOUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src", "trace", "frame_layout.json")

FAILS = []


def check(cond, what):
    if not cond:
        FAILS.append(what)
        print("FAIL", what)


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, **kw)


def scalar_series(logdir):
    """tag -> [(step, value)] of every scalar tag, and tag -> [(step, text)] of every text tag."""
    acc = pea.EventAccumulator(logdir, size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    scalars, texts = {}, {}
    scalar_tags = set(acc.PluginTagToContent("scalars"))
    for tag in acc.Tags()["tensors"]:
        rows = [(e.step, tensor_util.make_ndarray(e.tensor_proto)) for e in acc.Tensors(tag)]
        if tag in scalar_tags:
            scalars[tag] = [(s, float(v)) for s, v in rows]
        else:
            texts[tag] = [(s, v.item().decode()) for s, v in rows]
    return scalars, texts


def expected_series(doc):
    """What the export must hold, from `inspect --json`: tag -> [(step, value)] in trace order."""
    exp = {}

    def add(tag, step, value):  # JSON null: a value that is not finite (nan or inf)
        exp.setdefault(tag, []).append((step, None if value is None else float(value)))

    for s in doc["steps"]:
        t = s["timings"]
        add("train/loss", s["step"], s["loss"])
        add("train/learning_rate", s["step"], s["lr"])
        add("train/grad_norm_pre_clip", s["step"], s["grad_norm_pre"])
        add("train/grad_norm_post_clip", s["step"], s["grad_norm_post"])
        add("train/loss_scale", s["step"], s["loss_scale"])
        add("train/skipped", s["step"], 1.0 if s["outcome"] == "SKIP" else 0.0)
        add("time/step_ms", s["step"],
            t["data_ms"] + t["forward_ms"] + t["backward_ms"] + t["optimizer_ms"] + t["trace_ms"] + t["checkpoint_ms"])
        for k in ("data_ms", "forward_ms", "backward_ms", "optimizer_ms", "trace_ms", "allreduce_ms", "checkpoint_ms"):
            add("time/" + k, s["step"], t[k])
    for e in doc["evals"]:
        add("eval/loss", e["step"], e["loss"])
        if e["accuracy"] >= 0:
            add("eval/accuracy", e["step"], e["accuracy"])
        if e["tokens"] > 0:
            add("eval/perplexity", e["step"], e["perplexity"])
    for e in doc["events"]:
        add("markers/" + e["kind"], e["step"], 1.0)
    return exp


def same(got, exp):
    return (not math.isfinite(got)) if exp is None else got == exp


def differences(got, exp, label):
    out = []
    if set(got) != set(exp):
        out.append(f"{label}: tags {sorted(set(got) ^ set(exp))} in one only")
    for tag in sorted(set(got) & set(exp)):
        g, e = got[tag], exp[tag]
        if len(g) != len(e):
            out.append(f"{label}: {tag} has {len(g)} values, inspect --json {len(e)}")
            continue
        for i, ((gs, gv), (es, ev)) in enumerate(zip(g, e)):
            if gs != es or not same(gv, ev):
                out.append(f"{label}: {tag} value #{i}: step {gs} = {gv!r}, inspect --json: step {es} = {ev!r}")
                break
    return out


def compare(got, exp, label):
    for d in differences(got, exp, label):
        check(False, d)


def check_crcs(path):
    """Every record's two masked CRC32Cs, with TensorBoard's own function."""
    data = open(path, "rb").read()
    pos, n = 0, 0
    while pos < len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        (len_crc,) = struct.unpack_from("<I", data, pos + 8)
        body = data[pos + 12:pos + 12 + length]
        (body_crc,) = struct.unpack_from("<I", data, pos + 12 + length)
        check(len_crc == pywrap_tensorflow.masked_crc32c(data[pos:pos + 8]), f"{path}: length CRC of record {n}")
        check(body_crc == pywrap_tensorflow.masked_crc32c(body), f"{path}: data CRC of record {n}")
        pos += 12 + length + 4
        n += 1
    check(pos == len(data), f"{path}: {len(data) - pos} stray bytes at the end")
    return n


def main():
    retrace = os.path.abspath(sys.argv[1])
    tmp = tempfile.mkdtemp(prefix="tb-test-")
    try:
        os.chdir(tmp)
        rec = run([retrace, "record", "--plain", "--steps", "100", "--set", "data.batch_size=1024",
                   "--set", "model.hidden=[64]", "--set", "checkpoint.every_steps=10", "--set", "guards.spike_window=3",
                   "--set", "schedule.warmup_steps=5", "--inject", "nan-loss@5,inf-grad@9,spike@27",
                   "--out", "run", "--tensorboard", "live"])
        check(rec.returncode == 0, f"record failed: {rec.stderr[-2000:]}")
        doc = json.loads(run([retrace, "inspect", "run/trace.rtrace", "--json"]).stdout)
        kinds = {e["kind"] for e in doc["events"]}
        skips = sum(s["outcome"] == "SKIP" for s in doc["steps"])
        check("rollback" in kinds and skips >= 3 and len(doc["evals"]) >= 2,
              f"the run must have skips, a rollback and evaluations: events {kinds}, {skips} skips, "
              f"{len(doc['evals'])} evaluations")

        ex = run([retrace, "export", "run", "--tensorboard", "tb"])
        check(ex.returncode == 0, f"export failed: {ex.stderr}")
        files = sorted(os.listdir("tb"))
        check(len(files) == 1 and files[0].startswith("events.out.tfevents."), f"tb holds {files}")
        n = check_crcs(os.path.join("tb", files[0]))

        exp = expected_series(doc)
        got, texts = scalar_series("tb")
        compare(got, exp, "export")
        total = sum(len(v) for v in exp.values())
        print(f"export: {n} records, {len(got)} scalar tags, {total} scalars equal to inspect --json")
        skip_texts = texts.get("train/skip_reason", [])
        check([s for s, _ in skip_texts] == [s["step"] for s in doc["steps"] if s["outcome"] == "SKIP"] and
              all(t == s["skip_reason"] for (_, t), s in
                  zip(skip_texts, [s for s in doc["steps"] if s["outcome"] == "SKIP"])),
              "train/skip_reason texts are the SKIP steps' reasons")
        rb = [e for e in doc["events"] if e["kind"] == "rollback"]
        check([t for _, t in texts.get("events/rollback", [])] == [e["message"] for e in rb],
              "events/rollback texts are the rollback messages")
        check(any("seed" in t for _, t in texts.get("run/config", [])), "run/config holds the config")

        # The live view: the same values (wall times differ).
        live_files = os.listdir("live")
        check(len(live_files) == 1, f"live holds {live_files}")
        check_crcs(os.path.join("live", live_files[0]))
        live, _ = scalar_series("live")
        compare(live, exp, "live")

        # A second export is the same bytes (wall times come from the trace).
        os.rename("tb", "tb1")
        run([retrace, "export", "run", "--tensorboard", "tb"])
        check(open(os.path.join("tb", files[0]), "rb").read() == open(os.path.join("tb1", files[0]), "rb").read(),
              "two exports of one trace are the same bytes")

        # Bad input. A non-empty directory without --force: exit 2, nothing touched.
        open("tb/notes.txt", "w").write("mine")
        before = sorted(os.listdir("tb"))
        r = run([retrace, "export", "run", "--tensorboard", "tb"])
        check(r.returncode == 2 and "--force" in r.stderr and "not empty" in r.stderr,
              f"non-empty dir without --force: exit {r.returncode}, {r.stderr.strip()}")
        check(sorted(os.listdir("tb")) == before, "a refused export changes nothing")
        r = run([retrace, "export", "run", "--tensorboard", "tb", "--force"])
        check(r.returncode == 0 and sorted(os.listdir("tb")) == before and open("tb/notes.txt").read() == "mine",
              f"--force replaces the event files and keeps other files: {sorted(os.listdir('tb'))}")
        # A damaged trace: exit 3, and the directory's files are left as they were.
        shutil.copytree("run", "bad", ignore=shutil.ignore_patterns("checkpoints"))
        # One byte in the middle of the payload of the frame that holds the file's middle byte (a
        # frame header byte would be a different damage, reported differently).
        lay = json.load(open(LAYOUT))
        hs, len_at = lay["frame_header"]["size"], lay["frame_header"]["fields"]["compressed_len"]["offset"]
        data = bytearray(open("bad/trace.rtrace", "rb").read())
        off = lay["file_header"]["size"]
        while True:
            clen = struct.unpack_from("<I", data, off + len_at)[0]
            if off + hs + clen > len(data) // 2:
                break
            off += hs + clen
        data[off + hs + clen // 2] ^= 0xFF
        open("bad/trace.rtrace", "wb").write(bytes(data))
        r = run([retrace, "export", "bad", "--tensorboard", "tb", "--force"])
        check(r.returncode == 3 and "corrupt" in r.stderr,
              f"damaged trace: exit {r.returncode}, {r.stderr.strip()}")
        check(sorted(os.listdir("tb")) == before, "an export of a damaged trace removes nothing")
        r = run([retrace, "export", "nowhere", "--tensorboard", "tb2"])
        check(r.returncode == 4 and not os.path.exists("tb2"), f"missing trace: exit {r.returncode}, {r.stderr.strip()}")
        open("afile", "w").write("x")
        r = run([retrace, "export", "run", "--tensorboard", "afile"])
        check(r.returncode == 2 and "not a directory" in r.stderr, f"a file as the directory: {r.stderr.strip()}")
        r = run([retrace, "export", "run", "--tensorboard", "tb3", "--csv"])
        check(r.returncode == 2 and "exactly one" in r.stderr, f"two formats: {r.stderr.strip()}")

        # The negative control: the comparison catches one changed value.
        bad = {k: list(v) for k, v in exp.items()}
        step, value = bad["train/loss"][10]
        bad["train/loss"][10] = (step, math.nextafter(value, math.inf))
        caught = differences(got, bad, "negative control")
        check(len(caught) == 1 and "train/loss value #10" in caught[0],
              f"the comparison must catch a loss one ulp off, and only that: {caught}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if FAILS:
        print(f"{len(FAILS)} failures")
        return 1
    print("tensorboard: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
