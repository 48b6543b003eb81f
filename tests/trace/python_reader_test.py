#!/usr/bin/env python3
"""Checks the Python trace reader (python/retrace_trace.py) against `retrace inspect --json`.

    .venv/bin/python tests/trace/python_reader_test.py RETRACE_BIN GOLDEN_DIR

For every GOLDEN_DIR/*/trace.rtrace the reader's to_json() must equal the parsed output of
`RETRACE_BIN inspect TRACE --json` exactly (same keys, same types, same values; floats bit for bit).
Then, on copies in a temporary directory: a trace cut inside its last frame (both keep the same
frames), damaged frames (the reader raises TraceIntegrityError where inspect exits 3, or both
treat the damage as a tail), a frame of an unknown kind, text that is not UTF-8, edge values (a
repeated fingerprint key, a NUL in text, non-finite floats, -0.0), a non-trace file, a missing
file, the command line's exit codes, the layout's version and frame magic coming from the JSON,
and a negative control showing that the comparison does report a difference.

Exit 0 when every check passes; 1 and the failing checks (with the first difference) otherwise;
2 for a bad command line.
"""

import copy
import glob
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
MODULE = os.path.normpath(os.path.join(HERE, os.pardir, os.pardir, "python", "retrace_trace.py"))
sys.path.insert(0, os.path.dirname(MODULE))
sys.dont_write_bytecode = True  # no python/__pycache__ left in the source tree

import retrace_trace as rt  # noqa: E402

RETRACE = None
GOLDEN = []  # paths of the golden traces
TMP = None


# ----------------------------------------------------------------------------------------------
# Helpers


def first_difference(a, b, path="$"):
    """None when a and b are the same JSON value (same types: an int is not a float; floats equal
    bit for bit, so -0.0 is not 0.0), else a line naming the first path where they differ."""
    kinds = (bool, int, float, str, type(None), list, dict)
    ka = next((k for k in kinds if isinstance(a, k)), type(a))
    kb = next((k for k in kinds if isinstance(b, k)), type(b))
    if ka is not kb:
        return f"{path}: {type(a).__name__} {a!r} vs {type(b).__name__} {b!r}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a:
                return f"{path}: key {k!r} missing on the left (right has {b[k]!r:.80})"
            if k not in b:
                return f"{path}: key {k!r} missing on the right (left has {a[k]!r:.80})"
            d = first_difference(a[k], b[k], f"{path}.{k}")
            if d:
                return d
        return None
    if isinstance(a, list):
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f"{path}[{i}]")
            if d:
                return d
        if len(a) != len(b):
            return f"{path}: {len(a)} items vs {len(b)}"
        return None
    if isinstance(a, float):
        same = (a == b and math.copysign(1.0, a) == math.copysign(1.0, b)) or (math.isnan(a) and math.isnan(b))
        return None if same else f"{path}: {a!r} vs {b!r}"
    return None if a == b else f"{path}: {a!r:.200} vs {b!r:.200}"


def inspect(path):
    """(exit status, parsed JSON or None, stderr) of `retrace inspect PATH --json`."""
    p = subprocess.run([RETRACE, "inspect", path, "--json"], capture_output=True)
    j = json.loads(p.stdout.decode("utf-8")) if p.returncode == 0 else None
    return p.returncode, j, p.stderr.decode("utf-8", "replace").strip()


def inspect_json(path):
    rc, j, err = inspect(path)
    assert rc == 0, f"retrace inspect {path} --json exited {rc}: {err}"
    return j


def cli(*args):
    """(exit status, stdout, stderr) of the reader's command line."""
    p = subprocess.run([sys.executable, MODULE, *args], capture_output=True)
    return p.returncode, p.stdout.decode("utf-8"), p.stderr.decode("utf-8", "replace").strip()


def golden(name=None):
    """A golden trace: the one named `name` when there is one, else the largest."""
    for g in GOLDEN:
        if name and os.path.basename(os.path.dirname(g)) == name:
            return g
    return max(GOLDEN, key=os.path.getsize)


def copy_with(src, name, edit):
    """A copy of trace `src` in TMP named `name`, its bytes passed through edit(bytearray)."""
    data = bytearray(open(src, "rb").read())
    data = edit(data) or data
    dst = os.path.join(TMP, name)
    with open(dst, "wb") as f:
        f.write(bytes(data))
    return dst


def frame_end(f):
    return f.offset + rt.load_layout().frame_header_size + f.compressed_len


def expect_raises(exc, fn, contains=None):
    try:
        fn()
    except exc as e:
        assert contains is None or contains in str(e), f"{exc.__name__} without {contains!r}: {e}"
        return e
    except Exception as e:  # noqa: BLE001
        raise AssertionError(f"expected {exc.__name__}, got {type(e).__name__}: {e}") from None
    raise AssertionError(f"expected {exc.__name__}, nothing was raised")


def encode_frame(kind, step, raw):
    """One frame (header and zstd payload) built from the layout JSON, for crafted traces."""
    import zstandard

    lay = rt.load_layout()
    payload = zstandard.ZstdCompressor(level=3).compress(raw)
    h = bytearray(lay.frame_header_size)
    ff = lay.frame_fields
    values = {"magic": lay.frame_magic, "kind": kind, "flags": 0, "header_check": 0, "step": step,
              "compressed_len": len(payload), "raw_len": len(raw), "checksum": 0}
    for name, v in values.items():
        if name in ff:
            h[ff[name].offset : ff[name].offset + ff[name].size] = ff[name].pack(v)
    hc = ff["header_check"]
    h[hc.offset : hc.offset + hc.size] = hc.pack(lay.header_check(h))
    cs = ff["checksum"]
    h[cs.offset : cs.offset + cs.size] = cs.pack(lay.checksum(h, payload))
    return bytes(h) + payload


# ----------------------------------------------------------------------------------------------
# Checks


def check_goldens_equal_inspect():
    assert len(GOLDEN) >= 1, "no golden traces (GOLDEN_DIR/*/trace.rtrace) found"
    for g in GOLDEN:
        mine = rt.open_trace(g).to_json()
        d = first_difference(mine, inspect_json(g))
        assert d is None, f"{g}: reader vs inspect differ at {d}"
    return f"{len(GOLDEN)} golden traces equal"


def check_steps_frame():
    # faults has NaN losses (a nan-loss fault): they are NaN in the frame, null in the JSON.
    g = golden("faults")
    j = inspect_json(g)
    df = rt.steps_frame(g)
    steps = j["steps"]
    assert len(df) == len(steps), f"{len(df)} rows, {len(steps)} steps in inspect"
    assert "timings.data_ms" in df.columns and "loss" in df.columns, f"columns {list(df.columns)}"
    assert list(df["step"]) == [s["step"] for s in steps], "step column differs"
    non_finite = 0
    for i, (mine, theirs) in enumerate(zip(df["loss"], (s["loss"] for s in steps))):
        if theirs is None:
            assert not math.isfinite(mine), f"row {i}: loss {mine} where inspect has null"
            non_finite += 1
        else:
            assert mine == theirs, f"row {i}: loss {mine!r} vs inspect {theirs!r}"
    assert list(df["timings.forward_ms"]) == [s["timings"]["forward_ms"] for s in steps], "timings.forward_ms differ"
    return f"{len(df)} rows, losses equal ({non_finite} non-finite)"


def check_truncated():
    g = golden()
    t = rt.open_trace(g)
    last = t.frames[-1]
    results = []
    for what, cut in (("payload", (last.offset + frame_end(last)) // 2 + 16), ("header", last.offset + 10)):
        p = copy_with(g, f"cut-{what}.rtrace", lambda d: d[:cut])
        r = rt.open_trace(p)
        assert r.tail_warning, f"cut in the last frame's {what}: no tail_warning"
        assert str(last.offset) in r.tail_warning and str(cut - last.offset) in r.tail_warning, \
            f"tail_warning does not say where the tail starts and its size: {r.tail_warning}"
        j = inspect_json(p)
        assert first_difference(r.steps(), t.steps()[: len(r.steps())]) is None, "kept steps differ from the original's"
        d = first_difference(r.to_json()["steps"], j["steps"])
        assert d is None, f"cut in the {what}: steps differ from inspect's at {d}"
        d = first_difference(r.to_json(), j)
        assert d is None, f"cut in the {what}: to_json differs from inspect at {d}"
        assert len(r.frames) == len(t.frames) - 1
        rc, _, err = cli(p, "--json")
        assert rc == 0 and "warning:" in err, f"CLI on the cut trace: exit {rc}, stderr {err!r}"
        results.append(f"{what} cut: {len(r.frames)} frames kept")
    return ", ".join(results)


def middle_step(t):
    steps = [f for f in t.frames if f.kind_name == "step"]
    return steps[len(steps) // 2]


def check_flipped_payload_byte():
    g = golden()
    f = middle_step(rt.open_trace(g))
    at = f.offset + rt.load_layout().frame_header_size + f.compressed_len // 2

    def flip(d):
        d[at] ^= 0x40

    p = copy_with(g, "flipped.rtrace", flip)
    e = expect_raises(rt.TraceIntegrityError, lambda: rt.open_trace(p), f"at offset {f.offset}")
    rc, _, err = inspect(p)
    assert rc == 3, f"inspect of the damaged copy exited {rc}, expected 3: {err}"
    rc, _, err = cli(p)
    assert rc == 3 and err.startswith("retrace_trace: "), f"CLI on the damaged copy: exit {rc}, stderr {err!r}"
    return f"TraceIntegrityError ({str(e)[:60]}...), inspect and CLI exit 3"


def check_damaged_headers():
    g = golden()
    t = rt.open_trace(g)
    f = middle_step(t)
    lay = rt.load_layout()
    out = []
    # A header field the header check covers (the step field): the header is damaged.
    step_at = f.offset + lay.frame_fields["step"].offset

    def bump_step(d):
        d[step_at] ^= 0x01

    p = copy_with(g, "bad-header-check.rtrace", bump_step)
    expect_raises(rt.TraceIntegrityError, lambda: rt.open_trace(p), "frame header is damaged")
    rc, _, err = inspect(p)
    assert rc == 3, f"inspect: exit {rc}: {err}"
    out.append("header check")
    # A bad frame magic between valid frames: an error for both (inspect calls it a format error).
    magic_at = f.offset + lay.frame_fields["magic"].offset

    def bad_magic(d):
        d[magic_at] ^= 0xFF

    p = copy_with(g, "bad-magic.rtrace", bad_magic)
    expect_raises(rt.TraceIntegrityError, lambda: rt.open_trace(p), "bad frame magic")
    rc, _, err = inspect(p)
    assert rc == 3 and "bad frame magic" in err, f"inspect: exit {rc}: {err}"
    out.append("frame magic")
    # Damage in the last frame, nothing valid after it: a tail for both, not an error.
    last = t.frames[-1]
    at = last.offset + lay.frame_header_size + last.compressed_len // 2

    def flip_last(d):
        d[at] ^= 0x40

    p = copy_with(g, "garbage-tail.rtrace", flip_last)
    r = rt.open_trace(p)
    assert r.tail_warning and f"offset {last.offset}" in r.tail_warning, f"tail_warning {r.tail_warning!r}"
    d = first_difference(r.to_json(), inspect_json(p))
    assert d is None, f"damaged last frame: to_json differs from inspect at {d}"
    out.append("damaged last frame is a tail")
    # Zeros after the frames (a power loss): a tail.
    p = copy_with(g, "zeros.rtrace", lambda d: d + bytes(1000))
    r = rt.open_trace(p)
    assert r.tail_warning and "1000 bytes" in r.tail_warning, f"tail_warning {r.tail_warning!r}"
    d = first_difference(r.to_json(), inspect_json(p))
    assert d is None, f"zero tail: to_json differs from inspect at {d}"
    out.append("zero tail")
    return ", ".join(out)


def check_unknown_kind():
    g = golden()
    p = copy_with(g, "unknown-kind.rtrace", lambda d: d + encode_frame(99, 1, bytes(16)))
    expect_raises(rt.TraceFormatError, lambda: rt.open_trace(p), "unknown frame kind 99")
    rc, _, err = inspect(p)
    assert rc == 3, f"inspect: exit {rc}: {err}"
    # A second header frame: malformed for both.
    t = rt.open_trace(g)
    first = t.frames[0]
    header_frame = open(g, "rb").read()[first.offset : frame_end(first)]
    p = copy_with(g, "two-headers.rtrace", lambda d: d + header_frame)
    expect_raises(rt.TraceFormatError, lambda: rt.open_trace(p), "second header frame")
    rc, _, err = inspect(p)
    assert rc == 3, f"inspect: exit {rc}: {err}"
    return "unknown kind and a second header frame: TraceFormatError, inspect exits 3"


def check_invalid_utf8_text():
    """An event whose message is not UTF-8 (events are outside the hash chain, so inspect still reads
    the trace): both replace the bad bytes with U+FFFD the same way."""
    src = next((g for g in GOLDEN if rt.open_trace(g).events()), None)
    assert src is not None, "no golden trace has an event"
    t = rt.open_trace(src)
    ev = next(f for f in t.frames if f.kind_name == "event")
    schema = rt._load_bytes_schema(None)  # trace.capnp with Text read as Data
    message = b"bad \xff\xfe utf-8 \xe2\x82 end \xed\xa0\x80 \xc0\xaf \xf4\x90\x80\x80 \xe2\x82"
    msg = schema.Event.new_message(step=ev.step, kind=b"note\x00", message=message + b"\x00")
    raw = msg.to_bytes()
    frame = encode_frame(ev.kind, ev.step, raw)

    def replace(d):
        return d[: ev.offset] + frame + d[frame_end(ev):]

    p = copy_with(src, "utf8.rtrace", replace)
    r = rt.open_trace(p)
    got = [e for e in r.events() if e["kind"] == "note"]
    assert got and "\ufffd" in got[0]["message"], f"events {r.events()}"
    d = first_difference(r.to_json(), inspect_json(p))
    assert d is None, f"invalid UTF-8 text: to_json differs from inspect at {d}"
    return f"message read as {got[0]['message']!r}, as inspect"


def check_edge_values():
    """Values the goldens do not hold, in frames outside the hash chain (a header, evals): a repeated
    fingerprint key (the last one wins), text with a NUL in it, non-finite floats and -0.0."""
    g = golden("resumed")
    t = rt.open_trace(g)
    schema = rt._load_schema(None)
    lay = rt.load_layout()
    hf = t.frames[0]
    data = open(g, "rb").read()
    import zstandard

    raw = zstandard.ZstdDecompressor().decompress(data[hf.offset + lay.frame_header_size : frame_end(hf)],
                                                  max_output_size=hf.raw_len)
    with schema.Header.from_bytes(raw) as r:
        b = r.as_builder()
    old = [(kv.key, kv.value) for kv in b.fingerprint]
    fp = b.init("fingerprint", len(old) + 1)
    for i, (k, v) in enumerate(old + [(old[0][0], "repeated key, this value wins")]):
        fp[i].key, fp[i].value = k, v
    b.modelDescription = "a NUL \x00 inside, and \u00e9\u4e2d\U0001f600"
    header = encode_frame(hf.kind, hf.step, b.to_bytes())
    eval_kind = next(k for k, v in lay.kinds.items() if v == "Eval")
    evals = b"".join(
        encode_frame(eval_kind, 24, schema.Eval.new_message(step=24, epoch=1, samples=7, loss=loss,
                                                            accuracy=acc).to_bytes())
        for loss, acc in ((math.inf, math.nan), (-0.0, -math.inf), (5e-324, 1.7976931348623157e308)))
    p = copy_with(g, "edge.rtrace", lambda d: d[: hf.offset] + header + d[frame_end(hf):] + evals)
    r = rt.open_trace(p)
    j = inspect_json(p)
    d = first_difference(r.to_json(), j)
    assert d is None, f"edge values: to_json differs from inspect at {d}"
    assert r.header["fingerprint"][old[0][0]] == "repeated key, this value wins", "the repeated key's first value won"
    assert "\x00" in r.header["model_description"], "the NUL was lost"
    assert math.isinf(r.evals()[-3]["loss"]) and r.to_json()["evals"][-3]["loss"] is None
    return "repeated fingerprint key, NUL, non-finite, -0.0 and extreme floats as inspect"


def check_not_a_trace():
    p = os.path.join(TMP, "not-a-trace.txt")
    with open(p, "w") as f:
        f.write("this is not a retrace trace, just some text long enough\n")
    expect_raises(rt.TraceFormatError, lambda: rt.open_trace(p), "not a retrace trace")
    rc, _, err = inspect(p)
    assert rc == 3, f"inspect: exit {rc}: {err}"
    rc, _, err = cli(p)
    assert rc == 3 and err.startswith("retrace_trace: "), f"CLI on a non-trace: exit {rc}, {err!r}"
    empty = os.path.join(TMP, "empty.rtrace")
    open(empty, "wb").close()
    expect_raises(rt.TraceFormatError, lambda: rt.open_trace(empty), "shorter than")
    # A file header and nothing else: no header frame.
    lay = rt.load_layout()
    p = copy_with(golden(), "only-file-header.rtrace", lambda d: d[: lay.file_header_size])
    expect_raises(rt.TraceFormatError, lambda: rt.open_trace(p), "no header frame")
    rc, _, err = inspect(p)
    assert rc == 3, f"inspect: exit {rc}: {err}"
    # Another format version (the version field as the layout places it).
    v = lay.file_fields["version"]

    def version(d):
        d[v.offset : v.offset + v.size] = v.pack(lay.format_version + 1)

    p = copy_with(golden(), "version.rtrace", version)
    expect_raises(rt.TraceFormatError, lambda: rt.open_trace(p), "format version")
    rc, _, err = inspect(p)
    assert rc == 3, f"inspect: exit {rc}: {err}"
    return "TraceFormatError for text, empty, file-header-only and other-version files; exit 3"


def check_missing_and_cli():
    missing = os.path.join(TMP, "no-such-run", "trace.rtrace")
    expect_raises(FileNotFoundError, lambda: rt.open_trace(missing))
    rc, _, err = cli(missing)
    assert rc == 4 and "no-such-run" in err, f"CLI on a missing file: exit {rc}, {err!r}"
    rc, _, err = inspect(missing)
    assert rc == 4, f"inspect on a missing file: exit {rc}: {err}"
    g = golden("resumed")
    rc, out, err = cli(os.path.dirname(g), "--json")  # a run directory
    assert rc == 0, f"CLI --json on a run directory: exit {rc}: {err}"
    rc_i, j, err_i = inspect(os.path.dirname(g))
    assert rc_i == 0, f"inspect on a run directory: exit {rc_i}: {err_i}"
    d = first_difference(json.loads(out), j)
    assert d is None, f"CLI --json differs from inspect at {d}"
    rc, out, err = cli(g)
    assert rc == 0 and "step" in out and "loss" in out, f"CLI table: exit {rc}: {err}"
    return "missing: exit 4; run directory --json equals inspect; table prints"


def reflag_frame(data, offset, flags):
    """Sets the flags of the frame at `offset` in `data` (a bytearray) and reseals its header check
    and checksum, as a writer that meant those flags would have."""
    lay = rt.load_layout()
    ff, hs = lay.frame_fields, lay.frame_header_size
    clen = ff["compressed_len"].read(data[offset:offset + hs])
    h = bytearray(data[offset:offset + hs])
    h[ff["flags"].offset] = flags
    hc, cs = ff["header_check"], ff["checksum"]
    h[hc.offset : hc.offset + hc.size] = hc.pack(lay.header_check(h))
    h[cs.offset : cs.offset + cs.size] = cs.pack(lay.checksum(h, bytes(data[offset + hs:offset + hs + clen])))
    data[offset:offset + hs] = h
    return data


def check_format2_trace():
    """A trace this binary writes now (format 2): its step frames are compressed with the header's
    step dictionary and flagged so, the reader equals inspect on it, a step costs at most 256 bytes
    of file for the default MLP (the frame header included), and wrong flags are refused by both."""
    run = os.path.join(TMP, "fmt2")
    p = subprocess.run([RETRACE, "record", "--steps", "40", "--out", run, "--plain"], capture_output=True)
    assert p.returncode == 0, f"record exited {p.returncode}: {p.stderr.decode()[-2000:]}"
    path = os.path.join(run, "trace.rtrace")
    t = rt.open_trace(path)
    assert t.format_version == 2, f"format version {t.format_version}"
    lay = rt.load_layout()
    steps = [f for f in t.frames if lay.kinds.get(f.kind) == "Step"]
    flags = {lay.frame_fields["flags"].read(open(path, "rb").read()[f.offset:f.offset + lay.frame_header_size])
             for f in steps}
    assert flags == {lay.flag_step_dictionary}, f"step frame flags {flags}"
    d = first_difference(t.to_json(), inspect_json(path))
    assert d is None, f"reader vs inspect differ at {d}"
    per_step = sum(lay.frame_header_size + f.compressed_len for f in steps) / len(steps)
    assert per_step <= 256, f"{per_step:.1f} bytes per step frame, more than 256"
    first_step, header = steps[0], t.frames[0]
    for what, offset, value, message in (
            ("unknown flag", first_step.offset, 3, "frame flags 3"),
            ("flagged header", header.offset, 1, "flagged as compressed with the step dictionary")):
        bad = copy_with(path, f"fmt2-{what.replace(' ', '-')}.rtrace",
                        lambda data, o=offset, v=value: reflag_frame(data, o, v))
        expect_raises(rt.TraceFormatError, lambda b=bad: rt.open_trace(b).to_json(), message)
        rc, _, err = inspect(bad)
        assert rc == 3 and message in err, f"{what}: inspect exited {rc}: {err[-500:]}"
    return f"{len(steps)} step frames flagged, {per_step:.1f} bytes per step, wrong flags refused (exit 3)"


def check_layout_from_json():
    """The reader takes the layout from the JSON: the same trace under a layout of another format
    version is refused."""
    lay = rt.load_layout()
    j = json.load(open(lay.path))
    j["format_version"] += 1
    j["oldest_format_version"] = j["format_version"]
    p = os.path.join(TMP, "layout-v2.json")
    with open(p, "w") as f:
        json.dump(j, f)
    v = lay.format_version + 1
    expect_raises(rt.TraceFormatError, lambda: rt.open_trace(golden(), layout_path=p),
                  f"this reader reads versions {v} to {v}")
    j = json.load(open(lay.path))
    j["frame_header"]["magic"] ^= 1
    with open(p, "w") as f:
        json.dump(j, f)
    expect_raises(rt.TraceFormatError, lambda: rt.open_trace(golden(), layout_path=p), "no header frame")
    return "format version and frame magic come from the JSON"


def check_negative_control():
    g = golden("resumed")
    mine, theirs = rt.open_trace(g).to_json(), inspect_json(g)
    assert first_difference(mine, theirs) is None
    bad = copy.deepcopy(mine)
    i = len(bad["steps"]) // 2
    bad["steps"][i]["loss"] = math.nextafter(bad["steps"][i]["loss"], math.inf)
    d = first_difference(bad, theirs)
    assert d is not None and d.startswith(f"$.steps[{i}].loss"), f"a changed loss was not reported: {d}"
    bad = copy.deepcopy(mine)
    bad["header"]["seed"] = float(bad["header"]["seed"])  # same value, another type
    assert first_difference(bad, theirs) is not None, "an int turned float was not reported"
    bad = copy.deepcopy(mine)
    bad["steps"][0]["timings"]["allreduce_ms"] = -0.0 if theirs["steps"][0]["timings"]["allreduce_ms"] == 0 else 0.0
    assert first_difference(bad, theirs) is not None, "a changed zero sign was not reported"
    bad = copy.deepcopy(mine)
    bad["tail_warning"] = "x"
    assert first_difference(bad, theirs) is not None, "an extra key was not reported"
    return f"reported: {d}"


CHECKS = [
    check_goldens_equal_inspect,
    check_steps_frame,
    check_truncated,
    check_flipped_payload_byte,
    check_damaged_headers,
    check_unknown_kind,
    check_invalid_utf8_text,
    check_edge_values,
    check_not_a_trace,
    check_missing_and_cli,
    check_layout_from_json,
    check_format2_trace,
    check_negative_control,
]


def main():
    global RETRACE, GOLDEN, TMP
    if len(sys.argv) != 3:
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    RETRACE, golden_dir = os.path.abspath(sys.argv[1]), sys.argv[2]
    if not os.access(RETRACE, os.X_OK):
        print(f"python_reader_test: {RETRACE} is not an executable retrace binary", file=sys.stderr)
        return 2
    GOLDEN = sorted(glob.glob(os.path.join(golden_dir, "*", "trace.rtrace")))
    if not GOLDEN:
        print(f"FAIL python_reader_test: no golden traces {os.path.join(golden_dir, '*', 'trace.rtrace')}")
        return 1
    failed = []
    start = time.monotonic()
    TMP = tempfile.mkdtemp(prefix="python_reader_test_")
    try:
        for check in CHECKS:
            t0 = time.monotonic()
            try:
                what = check()
                print(f"PASS {check.__name__} ({time.monotonic() - t0:.2f}s): {what}")
            except Exception as e:  # noqa: BLE001
                failed.append(check.__name__)
                kind = "" if isinstance(e, AssertionError) else f"{type(e).__name__}: "
                print(f"FAIL {check.__name__}: {kind}{e}")
                if not isinstance(e, AssertionError):
                    traceback.print_exc()
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
    total = time.monotonic() - start
    if failed:
        print(f"python_reader_test: {len(failed)} of {len(CHECKS)} checks failed: {', '.join(failed)} ({total:.1f}s)")
        return 1
    print(f"python_reader_test: all {len(CHECKS)} checks passed ({total:.1f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
