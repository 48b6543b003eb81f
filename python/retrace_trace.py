#!/usr/bin/env python3
"""Read retrace trace files (``run/trace.rtrace``) from Python, without the retrace binary.

A retrace run records every training step to a binary trace file: a file header, then one frame
per record (the trace header first, then steps, evaluations and events in the order they
happened), each frame a small binary header followed by a zstd-compressed Cap'n Proto message.
This module reads such a file, checks every frame the way retrace's C++ reader does, and gives
the records as plain Python values (``dict``, ``list``, ``int``, ``float``, ``str``).

Requirements
------------
* Python 3.8 or newer, and the packages ``pycapnp`` (Cap'n Proto), ``zstandard`` and ``xxhash``
  (the versions pinned in tools/requirements-test.txt are the ones tested);
* ``pandas``, only for :func:`steps_frame`.

Where the byte layout and the schema come from
----------------------------------------------
Nothing about the byte layout is written in this file: every offset, field type, size, magic,
limit and frame kind is read from ``frame_layout.json`` (the file the C++ build generates its
``trace/frame_layout.h`` from), and the payloads are parsed with the Cap'n Proto schema
``trace.capnp``. Both are looked for, in order,

1. where the ``layout_path`` / ``schema_path`` arguments of :func:`open_trace` say;
2. in ``../src/trace/`` relative to this file (this file in a retrace checkout, ``python/``);
3. in the directory of this file (for an installed copy: put the two files next to it).

The schema imports ``/capnp/c++.capnp``, which pycapnp ships inside its package.

API
---
``open_trace(path, layout_path=None, schema_path=None) -> Trace``
    Opens and checks a trace file (or a run directory: ``RUN/trace.rtrace``). It reads every
    frame once (magic, header check, kind, length limits, checksum) and decodes the trace header;
    the other records are decoded when asked for, each read checked again against its checksum.

``Trace``
    ``.path``, ``.header`` (dict), ``.frames`` (a :class:`FrameInfo` per complete frame, in file
    order), ``.valid_bytes`` (the offset after the last complete frame), ``.tail_warning`` (str or
    ``None``; ``.tail_offset`` and ``.tail_bytes`` give the same as numbers), ``.steps()``,
    ``.evals()``, ``.events()`` (lists of dicts in file order: after a rollback or a resume a step
    number can appear again), and ``.to_json()``. Opening holds the whole file in memory while it
    is checked; afterwards each call reads the frames it needs again (so the file stays closed).

    The dicts have exactly the keys and value formats of ``retrace inspect TRACE --json``:
    digests as 32 lowercase hex digits (high word first; a digest an older trace lacks is 32
    zeros), ``outcome`` ``"STEP"`` or ``"SKIP"`` (the reason in ``skip_reason``), ``timings`` a
    nested dict of milliseconds, ``fingerprint`` a dict. One difference: ``steps()``, ``evals()``
    and ``events()`` keep non-finite floats (``nan``, ``inf``) as floats, while ``to_json()``
    writes them as ``None`` (JSON ``null``) as ``retrace inspect`` does. ``to_json()`` returns
    ``{"header", "steps", "evals", "events"}`` plus ``"tail_warning"`` when the file has a tail:
    equal to what ``json.loads`` makes of ``retrace inspect TRACE --json``. Text that is not valid
    UTF-8 is decoded with U+FFFD replacement characters, as ``retrace inspect`` writes it.

``steps_frame(path_or_trace, **open_args) -> pandas.DataFrame``
    One row per step frame, in file order, one column per scalar field of a step (the names of
    ``steps()``; the timings flattened to ``timings.data_ms``, ``timings.forward_ms``,
    ``timings.backward_ms``, ``timings.optimizer_ms``, ``timings.trace_ms``,
    ``timings.allreduce_ms``, ``timings.checkpoint_ms``). The list fields (``micro_batch_sizes``, ``micro_losses``,
    ``rank_grad_digests``, ``rank_rng_digests``) are left out: use ``steps()`` for them.
    Non-finite losses and norms are NaN / inf.

Errors (retrace exits 3 for the cases of the first two, both :class:`TraceError`)
    * :class:`TraceFormatError`: not a trace (short file, bad file magic, a format version other
      than the layout's, not a regular file), no header frame first or a second one, an unknown
      frame kind, a length over the limits, a payload that does not decompress to its raw length,
      a malformed record, an unknown trace schema;
    * :class:`TraceIntegrityError`: a damaged frame (bad frame magic, header check or checksum)
      that a complete, valid frame follows, or a frame that changed after the trace was opened
      (retrace calls the bad frame magic a format error; here all three are damage);
    * ``OSError`` (``FileNotFoundError``, ...): the file cannot be opened or read;
    * :class:`LayoutError` (a ``ValueError``): the layout file itself is not usable.

Tails. A file may end inside a frame (a crash cut the last write): the complete frames before it
are the trace and ``tail_warning`` says where the tail starts and how many bytes it has. The same
holds for damaged bytes that no complete, valid frame follows (a cut write, zero-filled or stale
blocks), as retrace's FrameScanner decides it.

Not checked here: the content digest and the hash chain of the steps (``retrace inspect`` and the
C++ reader verify them: a trace that reads here may still be refused there as edited); the reserved
bytes of the file header (neither does retrace).

Formats 1 and 2 are read. In format 2 a step frame whose flags have bit 0 set was compressed with
the header's ``step_dictionary`` (a zstd raw-content dictionary); any other flag is an error.

Example
-------
::

    import retrace_trace

    trace = retrace_trace.open_trace('run/trace.rtrace')
    print(trace.header['model_description'], trace.tail_warning or 'complete')
    for step in trace.steps():
        print(step['step'], step['loss'], step['outcome'], step['timings']['forward_ms'])

    df = retrace_trace.steps_frame('run/trace.rtrace')      # or a run directory: 'run'
    print(df[['step', 'loss', 'lr', 'timings.forward_ms']].describe())

Command line::

    python3 python/retrace_trace.py TRACE_OR_RUN_DIR [--json] [--layout JSON] [--schema CAPNP]

prints the ``to_json()`` dict (``--json``, indented by 2) or a short table. Exit status 0; 3 for a
damaged or invalid trace (``retrace_trace: <message>`` on stderr); 4 when the file cannot be read
(missing, unreadable) or the layout/schema files are missing; 2 for a bad command line.
"""

from __future__ import annotations

import argparse
import errno
import json
import math
import os
import re
import stat
import struct
import sys
import tempfile
from collections import namedtuple

try:
    import capnp
    import xxhash
    import zstandard
except ImportError as _e:  # say what to install rather than only what is missing
    raise ImportError(f"retrace_trace needs pycapnp, zstandard and xxhash ({_e}); install them with "
                      f"pip install -r tools/requirements-test.txt, or use retrace's .venv/bin/python") from _e

__all__ = [
    "TraceError",
    "TraceFormatError",
    "TraceIntegrityError",
    "LayoutError",
    "FrameInfo",
    "Layout",
    "Trace",
    "open_trace",
    "steps_frame",
    "load_layout",
    "main",
]

# The trace schema this reader understands, the `schema` field of the trace header. It names the
# Cap'n Proto records (records.h kTraceSchema), not the byte layout, so it is not in the JSON.
SUPPORTED_SCHEMA = "retrace.trace.v1"

# Cap'n Proto reader limits, as the C++ reader sets them (record_codec.h): a traversal limit of
# 4 x the message's words + 1024, and a nesting limit of 16.
TRAVERSAL_FACTOR = 4
TRAVERSAL_SLACK_WORDS = 1024
NESTING_LIMIT = 16
# A Cap'n Proto flat-array message is a whole number of 8-byte words (so raw_len is a multiple).
CAPNP_WORD = 8

LAYOUT_FILE = "frame_layout.json"
SCHEMA_FILE = "trace.capnp"
RUN_TRACE_FILE = "trace.rtrace"  # the trace of a run directory, RUN/trace.rtrace

# Exit codes of the command line, as retrace's (include/retrace/error.h).
EXIT_OK = 0
EXIT_CORRUPT = 3
EXIT_ENVIRONMENT = 4

_HERE = os.path.dirname(os.path.abspath(__file__))


# ----------------------------------------------------------------------------------------------
# Errors


class TraceError(Exception):
    """Base class of the errors about a trace file's contents."""


class TraceFormatError(TraceError):
    """The file is not a trace this reader can read (or a record in it is malformed)."""


class TraceIntegrityError(TraceError):
    """The file is a trace but bytes of it were damaged (a corrupt frame other frames follow)."""


class LayoutError(ValueError):
    """The layout description (frame_layout.json) is missing a field or contradicts itself."""


# ----------------------------------------------------------------------------------------------
# The layout


_SCALAR_TYPES = {"u8": "B", "u16": "H", "u32": "I", "u64": "Q"}
_TYPE_RE = re.compile(r"^(u8|u16|u32|u64|char)(?:\[(\d+)\])?$")


class _Field(namedtuple("_Field", "name offset size fmt")):
    """One field of a header: `fmt` is a struct code for a scalar, None for a byte array."""

    def read(self, buf, base=0):
        if self.fmt is None:
            return bytes(buf[base + self.offset : base + self.offset + self.size])
        return struct.unpack_from("<" + self.fmt, buf, base + self.offset)[0]

    def pack(self, value):
        return struct.pack("<" + self.fmt, value)


def _parse_fields(where, spec, size):
    fields = {}
    for name, f in spec.items():
        try:
            offset = int(f["offset"])
            m = _TYPE_RE.match(f["type"])
        except (KeyError, TypeError, ValueError) as e:
            raise LayoutError(f"{where}.{name}: needs an integer 'offset' and a 'type' ({e})") from None
        if m is None:
            raise LayoutError(f"{where}.{name}: unknown type {f['type']!r}")
        base, count = m.group(1), m.group(2)
        if base == "char" and count is None:
            raise LayoutError(f"{where}.{name}: char needs a length, char[N]")
        width = 1 if base == "char" else struct.calcsize("<" + _SCALAR_TYPES[base])
        n = 1 if count is None else int(count)
        fmt = _SCALAR_TYPES[base] if count is None else None
        if offset < 0 or offset + width * n > size:
            raise LayoutError(f"{where}.{name}: bytes {offset}..{offset + width * n - 1} lie outside "
                              f"the {size}-byte header")
        fields[name] = _Field(name, offset, width * n, fmt)
    return fields


class Layout:
    """The byte layout of a trace file, as frame_layout.json describes it.

    Attributes: ``path``, ``format_version``, ``file_header_size``, ``file_magic`` (bytes),
    ``file_fields`` / ``frame_fields`` (name -> field with ``offset``, ``size``),
    ``frame_header_size``, ``frame_magic`` (int), ``frame_magic_bytes`` (as stored),
    ``checked_bytes``, ``kinds`` (kind number -> root struct name), ``header_kind``,
    ``max_payload_len``, ``max_raw_factor``, ``max_raw_slack``.
    """

    _FILE_FIELDS = ("magic", "version")
    _FRAME_FIELDS = ("magic", "kind", "flags", "header_check", "step", "compressed_len", "raw_len", "checksum")

    def __init__(self, path):
        self.path = path
        try:
            with open(path, "rb") as f:
                j = json.loads(f.read().decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise LayoutError(f"{path} is not a JSON layout: {e}") from None
        try:
            self.format_version = int(j["format_version"])
            self.oldest_format_version = int(j.get("oldest_format_version", self.format_version))
            fh, fr, lim = j["file_header"], j["frame_header"], j["limits"]
            # Format 2: a step frame with this flag was compressed with the header's stepDictionary.
            self.flag_step_dictionary = int(fr.get("flag_step_dictionary", 0))
            self.file_header_size = int(fh["size"])
            self.file_magic = str(fh["magic"]).encode("ascii")
            self.file_fields = _parse_fields("file_header.fields", fh["fields"], self.file_header_size)
            self.frame_header_size = int(fr["size"])
            self.frame_magic = int(fr["magic"])
            self.frame_fields = _parse_fields("frame_header.fields", fr["fields"], self.frame_header_size)
            self.checked_bytes = int(fr["checked_bytes"])
            self.kinds = {int(k): str(v) for k, v in j["kinds"].items()}
            self.max_payload_len = int(lim["max_payload_len"])
            self.max_raw_factor = int(lim["max_raw_factor"])
            self.max_raw_slack = int(lim["max_raw_slack"])
        except (KeyError, TypeError, ValueError, UnicodeEncodeError) as e:
            raise LayoutError(f"{path}: missing or malformed entry ({type(e).__name__}: {e})") from None
        for name in self._FILE_FIELDS:
            if name not in self.file_fields:
                raise LayoutError(f"{path}: file_header.fields lacks {name!r}")
        for name in self._FRAME_FIELDS:
            if name not in self.frame_fields:
                raise LayoutError(f"{path}: frame_header.fields lacks {name!r}")
        ff = self.frame_fields
        if self.file_fields["magic"].size != len(self.file_magic) or self.file_fields["version"].fmt is None:
            raise LayoutError(f"{path}: file_header.magic does not fit its field, or version is not an integer")
        for name in ("magic", "kind", "flags", "header_check", "step", "compressed_len", "raw_len", "checksum"):
            if ff[name].fmt is None:
                raise LayoutError(f"{path}: frame_header.fields.{name} must be an integer type")
        self.frame_magic_bytes = ff["magic"].pack(self.frame_magic)
        hc, cs = ff["header_check"], ff["checksum"]
        if not (hc.offset + hc.size <= self.checked_bytes <= self.frame_header_size):
            raise LayoutError(f"{path}: the header check must lie inside the checked bytes")
        if cs.offset < self.checked_bytes:
            raise LayoutError(f"{path}: the checksum field lies inside the bytes it checks")
        headers = [k for k, v in self.kinds.items() if v == "Header"]
        if len(headers) != 1:
            raise LayoutError(f"{path}: kinds must name exactly one 'Header' kind")
        self.header_kind = headers[0]
        self._hc_mask = (1 << (8 * hc.size)) - 1

    def max_raw_len(self, compressed_len):
        """The largest raw length a frame of `compressed_len` compressed bytes may claim."""
        return self.max_raw_factor * compressed_len + self.max_raw_slack

    def kind_name(self, kind):
        """"header", "step", "eval", "event" (the kinds' names, lower case) or "unknown"."""
        name = self.kinds.get(kind)
        return name.lower() if name is not None else "unknown"

    def header_check(self, header):
        """The header check of a frame header as stored: xxh3_64 over the checked bytes without the
        check's own bytes, cut to the check's width."""
        hc = self.frame_fields["header_check"]
        data = bytes(header[: hc.offset]) + bytes(header[hc.offset + hc.size : self.checked_bytes])
        return xxhash.xxh3_64_intdigest(data) & self._hc_mask

    def checksum(self, header, payload):
        """xxh3_64 over the checked bytes of a frame header followed by its compressed payload."""
        h = xxhash.xxh3_64()
        h.update(bytes(header[: self.checked_bytes]))
        h.update(payload)
        return h.intdigest()


def _find_file(name, explicit):
    """`explicit` when given, else the first of ../src/trace/NAME and ./NAME next to this file."""
    if explicit is not None:
        if not os.path.isfile(explicit):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), explicit)
        return explicit
    candidates = [os.path.normpath(os.path.join(_HERE, os.pardir, "src", "trace", name)), os.path.join(_HERE, name)]
    for c in candidates:
        if os.path.isfile(c):
            return c
    raise FileNotFoundError(errno.ENOENT, f"not found in {' or '.join(candidates)}; pass its path", name)


def load_layout(layout_path=None):
    """The :class:`Layout` of `layout_path`, or of the frame_layout.json found as described above."""
    return Layout(_find_file(LAYOUT_FILE, layout_path))


_schemas = {}


def _load_schema(schema_path):
    """The pycapnp module of trace.capnp (cached per path)."""
    path = os.path.realpath(_find_file(SCHEMA_FILE, schema_path))
    if path not in _schemas:
        _schemas[path] = capnp.load(path, imports=[os.path.dirname(os.path.dirname(capnp.__file__))])
    return _schemas[path]


_bytes_schemas = {}


def _load_bytes_schema(schema_path):
    """trace.capnp with every Text read as Data (same wire encoding, a list of bytes ending in a
    NUL): for text that is not valid UTF-8, which pycapnp refuses to decode. Made only when needed."""
    path = os.path.realpath(_find_file(SCHEMA_FILE, schema_path))
    if path not in _bytes_schemas:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        out, id_done = [], False
        for line in lines:
            code, hash_, comment = line.partition("#")
            if not id_done:
                m = re.match(r"^(\s*@0x)([0-9a-fA-F]+)(\s*;.*)$", code)
                if m:  # a different file id, so that both schemas can be loaded
                    code = m.group(1) + format(int(m.group(2), 16) ^ 1, "x") + m.group(3)
                    id_done = True
            code = re.sub(r"(?<![A-Za-z0-9_])Text(?![A-Za-z0-9_])", "Data", code)
            out.append(code + hash_ + comment)
        with tempfile.TemporaryDirectory(prefix="retrace_trace_") as d:
            p = os.path.join(d, "trace_bytes.capnp")
            with open(p, "w", encoding="utf-8") as f:
                f.write("\n".join(out))
            _bytes_schemas[path] = capnp.load(p, imports=[os.path.dirname(os.path.dirname(capnp.__file__))])
    return _bytes_schemas[path]


# ----------------------------------------------------------------------------------------------
# Frames

FrameInfo = namedtuple("FrameInfo", "kind kind_name step offset compressed_len raw_len checksum")
FrameInfo.__doc__ = """One complete, checked frame: its kind (number and name), the step of its
header, its offset in the file, its compressed and raw payload lengths and its checksum."""


def _hex64(v):
    return "0x%016x" % v


class _Scanner:
    """Walks the frames of [start, end) of `buf`, checking each one: a port of the C++
    FrameScanner::next (src/trace/frame_scanner.cpp), with its messages."""

    def __init__(self, buf, path, layout, start, end):
        self.buf, self.path, self.lay = buf, path, layout
        self.pos, self.end, self.number = start, end, 0
        self.tail_bytes, self.garbage_tail = 0, False
        self.f_magic = layout.frame_fields["magic"]

    def _decode(self, p):
        return {name: fld.read(self.buf, p) for name, fld in self.lay.frame_fields.items()}

    def _frame_at(self, offset):
        """Whether a complete, checked frame starts at offset (as FrameScanner::frame_at: magic,
        header check, known kind, the payload limit, complete, checksum)."""
        lay, hs = self.lay, self.lay.frame_header_size
        if offset + hs > self.end or self.f_magic.read(self.buf, offset) != lay.frame_magic:
            return False
        header = self.buf[offset : offset + hs]
        h = self._decode(offset)
        if (lay.header_check(header) != h["header_check"] or h["kind"] not in lay.kinds
                or h["compressed_len"] > lay.max_payload_len or h["raw_len"] > lay.max_payload_len):
            return False
        size = hs + h["compressed_len"]
        if offset + size > self.end:
            return False
        return lay.checksum(header, self.buf[offset + hs : offset + size]) == h["checksum"]

    def _any_frame_after(self, offset):
        magic = self.lay.frame_magic_bytes
        at = offset
        while True:
            cand = self.buf.find(magic, at, self.end)
            if cand < 0:
                return False
            cand -= self.f_magic.offset
            if cand >= offset and self._frame_at(cand):
                return True
            at = cand + self.f_magic.offset + 1

    def _damaged(self, error):
        """A damaged frame: an error when a complete frame follows it, else the tail."""
        if self._any_frame_after(self.pos + 1):
            raise error
        self.tail_bytes = self.end - self.pos
        self.garbage_tail = True

    def next(self):
        """The next complete, checked frame as (header dict, offset, number), or None at the end
        or at a tail (then tail_bytes and garbage_tail say which)."""
        self.tail_bytes, self.garbage_tail = 0, False
        lay, pos, path, n = self.lay, self.pos, self.path, self.number
        if pos >= self.end:
            return None
        hs = lay.frame_header_size
        have = min(hs, self.end - pos)
        mg = self.f_magic
        if have >= mg.offset + mg.size:
            magic = mg.read(self.buf, pos)
            if magic != lay.frame_magic:
                self._damaged(TraceIntegrityError(
                    f"bad frame magic {_hex64(magic)} at offset {pos} of {path} (frame #{n}), expected "
                    f"{_hex64(lay.frame_magic)}; the file is damaged. Restore it from a copy, or truncate it "
                    f"to {pos} bytes to keep the frames before it"))
                return None
        if have < hs:
            self.tail_bytes = have
            return None
        header = self.buf[pos : pos + hs]
        h = self._decode(pos)
        check = lay.header_check(header)
        if check != h["header_check"]:
            self._damaged(TraceIntegrityError(
                f"corrupt frame checksum at offset {pos} of {path} (frame #{n}, step field {h['step']}): the "
                f"frame header is damaged (header check {h['header_check']}, computed {check}). Restore the "
                f"file from a copy, or truncate it to {pos} bytes to keep the frames before it"))
            return None
        if h["kind"] not in lay.kinds:
            raise TraceFormatError(
                f"unknown frame kind {h['kind']} at offset {pos} of {path} (frame #{n}); the file was written "
                f"by a newer retrace, read it with that version")
        clen, rlen = h["compressed_len"], h["raw_len"]
        if clen > lay.max_payload_len or rlen > lay.max_payload_len:
            raise TraceFormatError(
                f"frame at offset {pos} of {path} (frame #{n}) claims a payload of {clen} compressed / {rlen} "
                f"raw bytes, over the limit of {lay.max_payload_len}")
        if rlen > lay.max_raw_len(clen):
            raise TraceFormatError(
                f"frame at offset {pos} of {path} (frame #{n}) claims {rlen} raw bytes from {clen} compressed "
                f"ones, more than a trace writer ever produces (at most {lay.max_raw_len(clen)}); the file "
                f"was not written by retrace")
        size = hs + clen
        if pos + size > self.end:
            self.tail_bytes = self.end - pos
            return None
        total = lay.checksum(header, self.buf[pos + hs : pos + size])
        if total != h["checksum"]:
            self._damaged(TraceIntegrityError(
                f"corrupt frame checksum at offset {pos} of {path} (frame #{n}, {lay.kind_name(h['kind'])} step "
                f"{h['step']}): stored {_hex64(h['checksum'])}, computed {_hex64(total)}. The bytes were "
                f"damaged after they were written; restore the file from a copy, or truncate it to {pos} "
                f"bytes to keep the frames before it"))
            return None
        self.pos += size
        self.number += 1
        return h, pos, n


# ----------------------------------------------------------------------------------------------
# Records


def _digest(d):
    """Digest128::hex(): 32 lowercase hex digits, hi word first."""
    return "%016x%016x" % (d.hi, d.lo)


def _as_text(v):
    return v  # pycapnp already decoded the Text as UTF-8


def _as_bytes_text(v):
    # A Text read as Data: the bytes and the NUL that ends them.
    b = bytes(v)
    if b.endswith(b"\x00"):
        b = b[:-1]
    return b.decode("utf-8", "replace")


def _header_dict(b, t):
    fingerprint = {}
    for kv in b.fingerprint:
        fingerprint[t(kv.key)] = t(kv.value)  # a repeated key: the last one wins, as in inspect
    return {
        "schema": t(b._get("schema")),  # b.schema is pycapnp's: the struct's own schema
        "retrace_version": t(b.retraceVersion),
        "config_toml": t(b.configToml),
        "config_hash": t(b.configHash),
        "seed": b.seed,
        "fingerprint": fingerprint,
        "model_description": t(b.modelDescription),
        "params": [{"name": t(p.name), "shape": [int(d) for d in p.shape], "dtype": t(p.dtype)} for p in b.params],
        "data_files": [{"path": t(f.path), "size": f.size, "sha256": t(f.sha256)} for f in b.dataFiles],
        "faults": [{"kind": t(f.kind), "step": f.step, "arg": t(f.arg)} for f in b.faults],
        "total_steps": b.totalSteps,
        "effective_batch": b.effectiveBatch,
        "world_size": b.worldSize,
        "created_utc": t(b.createdUtc),
        "step_dictionary": bytes(b.stepDictionary),  # format 2; empty in format 1
    }


def _step_dict(b, t, outcomes, where):
    raw = b.outcome.raw
    if raw == outcomes["skip"]:
        outcome = "SKIP"
    elif raw == outcomes["step"]:
        outcome = "STEP"
    else:
        raise TraceFormatError(f"{where} has step outcome {raw}, which this reader does not know; read it with "
                               f"the retrace that wrote it")
    if b._has("timingsNs"):  # whole nanoseconds (format 2 writers); ns / 1e6 is the double retrace wrote
        n = b.timingsNs
        timings = {"data_ms": n.dataNs / 1e6, "forward_ms": n.forwardNs / 1e6, "backward_ms": n.backwardNs / 1e6,
                   "optimizer_ms": n.optimizerNs / 1e6, "trace_ms": n.traceNs / 1e6,
                   "allreduce_ms": n.allreduceNs / 1e6, "checkpoint_ms": n.checkpointNs / 1e6}
    else:
        tm = b.timings
        timings = {"data_ms": tm.dataMs, "forward_ms": tm.forwardMs, "backward_ms": tm.backwardMs,
                   "optimizer_ms": tm.optimizerMs, "trace_ms": tm.traceMs, "allreduce_ms": tm.allreduceMs,
                   "checkpoint_ms": tm.checkpointMs}
    d = {
        "step": b.step,
        "epoch": b.epoch,
        "batch_in_epoch": b.batchInEpoch,
        "batch_size": b.batchSize,
        "sample_digest": _digest(b.sampleDigest),
        "loss": b.loss,
        "loss_bits": b.lossBits,
        "grad_norm_pre": b.gradNormPre,
        "grad_norm_post": b.gradNormPost,
        "lr": b.lr,
        "loss_scale": b.lossScale,
        "outcome": outcome,
        "skip_reason": t(b.skipReason),
        "param_digest": _digest(b.paramDigest),
        "optim_digest": _digest(b.optimDigest),
        "rng_digest": _digest(b.rngDigest),
        "state_digest": _digest(b.stateDigest),  # all zeros when absent (older traces)
        "grad_digest": _digest(b.gradDigest),  # trace.digest_version 3; all zeros before it
        "micro_batch_sizes": [int(v) for v in b.microBatchSizes],
        "micro_losses": [float(v) for v in b.microLosses],
        "rank_grad_digests": [_digest(d) for d in b.rankGradDigests],
        "rank_rng_digests": [_digest(d) for d in b.rankRngDigests],
        "content_digest": _digest(b.contentDigest),
        "chain_digest": _digest(b.chainDigest),
        "allreduce_calls": b.allreduceCalls,
        "allreduce_bytes": b.allreduceBytes,
        "timings": timings,
    }
    if len(b.moduleDigests):  # a recorder run's, per module (as retrace inspect --json: only when present)
        d["module_digests"] = [{"module": t(m.module), "param": _digest(m.param), "grad": _digest(m.grad),
                                "optim": _digest(m.optim)} for m in b.moduleDigests]
    return d


def _eval_dict(b, t):
    tokens = b.tokens
    return {"step": b.step, "epoch": b.epoch, "samples": b.samples, "loss": b.loss, "accuracy": b.accuracy,
            "tokens": tokens, "batches": b.batches, "perplexity": math.exp(b.loss) if tokens > 0 else 0.0}


def _event_dict(b, t):
    return {"step": b.step, "kind": t(b.kind), "message": t(b.message)}


def _json_value(v):
    """A record value as retrace inspect --json writes it: non-finite floats become None."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _json_value(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_json_value(x) for x in v]
    return v


# ----------------------------------------------------------------------------------------------
# The trace


class Trace:
    """An open, checked trace file. Make one with :func:`open_trace`."""

    def __init__(self, path, layout_path=None, schema_path=None):
        if os.path.isdir(path):
            path = os.path.join(path, RUN_TRACE_FILE)
        self.path = path
        self.layout = load_layout(layout_path)
        self._schema_path = schema_path
        self._schema = _load_schema(schema_path)
        lay = self.layout
        self._roots = {}
        for kind, name in lay.kinds.items():
            root = getattr(self._schema, name, None)
            if root is None:
                raise LayoutError(f"{lay.path}: kind {kind} names {name!r}, which {SCHEMA_FILE} does not define")
            self._roots[kind] = name
        self._outcomes = dict(self._schema.Outcome.schema.enumerants)

        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0))
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise TraceFormatError(f"{path} is not a regular file (a FIFO, socket, device or directory is in "
                                       f"its place); only regular files are read")
            size = st.st_size
            buf = _read_at(fd, size, 0)
        finally:
            os.close(fd)
        size = len(buf)  # what could be read of it
        self._check_file_header(buf, size)

        self.frames = []
        scanner = _Scanner(buf, path, lay, lay.file_header_size, size)
        while True:
            f = scanner.next()
            if f is None:
                break
            h, offset, number = f
            if (h["kind"] == lay.header_kind) != (number == 0):
                what = (": trace has no header frame (the first frame, at offset " if number == 0
                        else ": a second header frame at offset ")
                raise TraceFormatError(f"{path}{what}{offset}, is a {lay.kind_name(h['kind'])} frame); the file is "
                                       f"not a well-formed trace")
            self.frames.append(FrameInfo(h["kind"], lay.kind_name(h["kind"]), h["step"], offset, h["compressed_len"],
                                         h["raw_len"], h["checksum"]))
        self.valid_bytes = scanner.pos
        if not self.frames:
            raise TraceFormatError(f"{path}: trace has no header frame (the file ends at byte {size} before its "
                                   f"header frame is complete)")
        self.tail_warning = None
        if scanner.tail_bytes > 0:  # the words of the C++ reader's tail_warning()
            if scanner.garbage_tail:
                what = "bytes that are not a frame"
                how = " bytes that no complete frame follows, as a crash or power loss leaves them"
            else:
                what, how = "an incomplete frame", " bytes, a write cut short"
            self.tail_warning = (f"trace {path} ends with {what} at offset {scanner.pos} ({scanner.tail_bytes}{how}); "
                                 f"the {len(self.frames)} complete frames before it are used")
        self.tail_offset = scanner.pos if self.tail_warning else None
        self.tail_bytes = scanner.tail_bytes

        # The payloads are read again, one frame at a time, when records are asked for.
        del buf, scanner
        self.header = self._records(lay.header_kind)[0]
        self._step_dictionary = self.header.pop("step_dictionary")  # the frames', not a field of the record
        if self.header["schema"] != SUPPORTED_SCHEMA:
            raise TraceFormatError(f"trace {path} has schema \"{self.header['schema']}\" but this reader reads "
                                   f"\"{SUPPORTED_SCHEMA}\"; it was probably written by a newer retrace")

    def _check_file_header(self, buf, size):
        lay, path = self.layout, self.path
        if size < lay.file_header_size:
            raise TraceFormatError(f"{path} is not a retrace trace: it is {size} bytes long, shorter than the "
                                   f"{lay.file_header_size}-byte file header")
        if lay.file_fields["magic"].read(buf) != lay.file_magic:
            raise TraceFormatError(f"{path} is not a retrace trace: its first bytes are not the magic "
                                   f"\"{lay.file_magic.decode('ascii')}\"")
        version = lay.file_fields["version"].read(buf)
        if not lay.oldest_format_version <= version <= lay.format_version:
            raise TraceFormatError(f"{path} has trace format version {version} but this reader reads versions "
                                   f"{lay.oldest_format_version} to {lay.format_version}; read it with the retrace "
                                   f"version that wrote it")
        reserved = lay.file_fields.get("reserved")
        if reserved is not None and any(buf[reserved.offset:reserved.offset + reserved.size]):
            raise TraceFormatError(f"{path}: the file header's reserved bytes {reserved.offset} to "
                                   f"{reserved.offset + reserved.size - 1} are not zero; this is not a trace retrace "
                                   f"wrote, or its header was damaged")
        self.format_version = version

    def __repr__(self):
        return (f"<Trace {self.path!r}: {len(self.frames)} frames, {self.valid_bytes} bytes"
                f"{', with a tail' if self.tail_warning else ''}>")

    def where(self, f):
        """Where a frame is, in words: "step frame at offset 1234 (step 5) of PATH"."""
        return f"{f.kind_name} frame at offset {f.offset} (step {f.step}) of {self.path}"

    def _payloads(self, kind):
        """(frame, raw payload) of every frame of `kind`, in file order, each read again and checked."""
        lay = self.layout
        frames = [f for f in self.frames if f.kind == kind]
        if not frames:
            return
        hs = lay.frame_header_size
        fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0))
        try:
            dctx = zstandard.ZstdDecompressor()
            dict_dctx = None  # made from the header's step dictionary when a flagged frame needs it
            for f in frames:
                size = hs + f.compressed_len
                data = _read_at(fd, size, f.offset)
                if len(data) != size:
                    raise OSError(f"trace {self.path} became shorter while being read: {self.where(f)} is no longer "
                                  f"complete")
                clen = lay.frame_fields["compressed_len"].read(data)
                total = lay.checksum(data[:hs], memoryview(data)[hs:])
                if clen != f.compressed_len or total != f.checksum or total != lay.frame_fields["checksum"].read(data):
                    raise TraceIntegrityError(
                        f"corrupt frame checksum at offset {f.offset} of {self.path}: the frame changed after the "
                        f"trace was opened ({self.where(f)}); another process is writing the file, or the disk is "
                        f"failing")
                if f.raw_len % CAPNP_WORD != 0:
                    raise TraceFormatError(f"{self.where(f)} has a raw length of {f.raw_len} bytes, not a whole number "
                                           f"of {CAPNP_WORD}-byte words")
                payload = data[hs:]
                flags = lay.frame_fields["flags"].read(data)
                if flags & ~lay.flag_step_dictionary:
                    raise TraceFormatError(f"{self.where(f)} has frame flags {flags}; only bit 0 (the step dictionary) "
                                           f"is defined. It was written by a newer retrace: read it with that version")
                use = dctx
                if flags & lay.flag_step_dictionary:
                    dictionary = getattr(self, "_step_dictionary", b"")
                    if kind == lay.header_kind or not dictionary or lay.kinds.get(kind) != "Step":
                        raise TraceFormatError(f"{self.where(f)} is flagged as compressed with the step dictionary, "
                                               f"but only step frames of a trace whose header holds one are; the "
                                               f"file is damaged")
                    if dict_dctx is None:
                        dict_dctx = zstandard.ZstdDecompressor(dict_data=zstandard.ZstdCompressionDict(
                            dictionary, dict_type=zstandard.DICT_TYPE_RAWCONTENT))
                    use = dict_dctx
                try:
                    declared = zstandard.frame_content_size(payload)
                    if declared not in (-1, f.raw_len):
                        raise TraceFormatError(f"{self.where(f)} decompresses to {declared} bytes but its header says "
                                               f"{f.raw_len}")
                    raw = use.decompress(payload, max_output_size=max(f.raw_len, 1), allow_extra_data=False)
                except zstandard.ZstdError as e:
                    raise TraceFormatError(f"cannot decompress {self.where(f)}: {e}") from None
                if len(raw) != f.raw_len:
                    raise TraceFormatError(f"{self.where(f)} decompresses to {len(raw)} bytes but its header says "
                                           f"{f.raw_len}")
                yield f, raw
        finally:
            os.close(fd)

    def _parse(self, f, raw, schema, text):
        root = getattr(schema, self._roots[f.kind])
        name = self._roots[f.kind]
        where = self.where(f)
        words = len(raw) // CAPNP_WORD
        try:
            with root.from_bytes(raw, traversal_limit_in_words=TRAVERSAL_FACTOR * words + TRAVERSAL_SLACK_WORDS,
                                 nesting_limit=NESTING_LIMIT) as b:
                if name == "Header":
                    return _header_dict(b, text)
                if name == "Step":
                    r = _step_dict(b, text, self._outcomes, where)
                    if r["step"] != f.step:
                        raise TraceFormatError(f"{where} holds a record of step {r['step']}; the frame header and "
                                               f"the record disagree")
                    return r
                if name == "Eval":
                    return _eval_dict(b, text)
                if name == "Event":
                    return _event_dict(b, text)
                raise LayoutError(f"{self.layout.path}: no reader for records of kind {name!r}")
        except capnp.KjException as e:
            desc = getattr(e, "description", None) or str(e)
            raise TraceFormatError(f"malformed record in {where}: {desc}; the frame checksum matched, so the file "
                                   f"was written by a different or broken writer") from None

    def _records(self, kind):
        out = []
        for f, raw in self._payloads(kind):
            try:
                out.append(self._parse(f, raw, self._schema, _as_text))
            except UnicodeDecodeError:
                # Text that is not UTF-8: read it as bytes and replace what does not decode.
                out.append(self._parse(f, raw, _load_bytes_schema(self._schema_path), _as_bytes_text))
        return out

    def _kind(self, name):
        for k, v in self.layout.kinds.items():
            if v == name:
                return k
        raise LayoutError(f"{self.layout.path}: kinds has no {name!r}")

    def steps(self):
        """Every step record, in file order (a step number can repeat after a rollback or resume)."""
        return self._records(self._kind("Step"))

    def evals(self):
        """Every evaluation record, in file order."""
        return self._records(self._kind("Eval"))

    def events(self):
        """Every event record (resume, rollback, fault injected, ...), in file order."""
        return self._records(self._kind("Event"))

    def to_json(self):
        """The dict `retrace inspect TRACE --json` prints (after json.loads)."""
        j = {
            "header": _json_value(self.header),
            "steps": _json_value(self.steps()),
            "evals": _json_value(self.evals()),
            "events": _json_value(self.events()),
        }
        if self.tail_warning is not None:
            j["tail_warning"] = self.tail_warning
        return j


def _read_at(fd, size, offset):
    """Up to `size` bytes at `offset` (fewer only at the end of the file)."""
    parts, got = [], 0
    while got < size:
        chunk = os.pread(fd, min(size - got, 1 << 24), offset + got)
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def open_trace(path, layout_path=None, schema_path=None):
    """Opens and checks the trace file at `path` (a run directory means RUN/trace.rtrace).

    `layout_path` and `schema_path` override where frame_layout.json and trace.capnp are found.
    Raises TraceFormatError / TraceIntegrityError (see the module's documentation), OSError when the
    file cannot be read."""
    return Trace(os.fspath(path), layout_path=layout_path, schema_path=schema_path)


STEP_FRAME_COLUMNS = [
    "step", "epoch", "batch_in_epoch", "batch_size", "sample_digest", "loss", "loss_bits", "grad_norm_pre",
    "grad_norm_post", "lr", "loss_scale", "outcome", "skip_reason", "param_digest", "optim_digest", "rng_digest",
    "state_digest", "grad_digest", "content_digest", "chain_digest", "allreduce_calls", "allreduce_bytes",
    "timings.data_ms", "timings.forward_ms", "timings.backward_ms", "timings.optimizer_ms", "timings.trace_ms",
    "timings.allreduce_ms", "timings.checkpoint_ms",
]


def steps_frame(path_or_trace, **open_args):
    """A pandas DataFrame of the steps: one row per step frame in file order, the columns
    STEP_FRAME_COLUMNS (the scalar fields of steps(), timings flattened as "timings.<name>")."""
    try:
        import pandas as pd
    except ImportError:
        raise ImportError("steps_frame needs pandas (pip install pandas); Trace.steps() does not") from None
    trace = path_or_trace if isinstance(path_or_trace, Trace) else open_trace(path_or_trace, **open_args)
    rows = []
    for s in trace.steps():
        row = {k: v for k, v in s.items() if not isinstance(v, (list, dict))}
        for k, v in s["timings"].items():
            row["timings." + k] = v
        rows.append([row[c] for c in STEP_FRAME_COLUMNS])
    return pd.DataFrame(rows, columns=STEP_FRAME_COLUMNS)


# ----------------------------------------------------------------------------------------------
# Command line


def _print_table(trace, out):
    h = trace.header
    lines = [
        f"trace        {trace.path}",
        f"schema       {h['schema']}",
        f"version      {h['retrace_version']}",
        f"seed         {h['seed']}",
        f"world size   {h['world_size']}",
        f"created      {h['created_utc']}",
        f"model        {h['model_description']}",
        f"total steps  {h['total_steps']}",
        f"frames       {len(trace.frames)} ({trace.valid_bytes} bytes)",
    ]
    if trace.tail_warning:
        lines.append(f"warning: {trace.tail_warning}")
    lines.append("")
    lines.append(f"{'step':>7} {'epoch':>5} {'batch':>6} {'loss':>12} {'grad_pre':>11} {'lr':>11} {'outcome':<10} "
                 f"{'chain':<12} {'step_ms':>9}")
    for s in trace.steps():
        t = s["timings"]
        ms = t["data_ms"] + t["forward_ms"] + t["backward_ms"] + t["optimizer_ms"] + t["trace_ms"] + t["checkpoint_ms"]
        outcome = "STEP" if s["outcome"] == "STEP" else "SKIP:" + s["skip_reason"]
        lines.append(f"{s['step']:>7} {s['epoch']:>5} {s['batch_in_epoch']:>6} {s['loss']:>12.6f} "
                     f"{s['grad_norm_pre']:>11.4g} {s['lr']:>11.4g} {outcome:<10} {s['chain_digest'][:12]:<12} "
                     f"{ms:>9.2f}")
    evals, events = trace.evals(), trace.events()
    lines.append("")
    lines.append("evals" + ("" if evals else ": none"))
    for e in evals:
        if e["tokens"] > 0:
            lines.append(f"  step {e['step']} epoch {e['epoch']}: loss {e['loss']:.6f}, perplexity "
                         f"{e['perplexity']:.4f} over {e['tokens']} tokens ({e['samples']} samples)")
        else:
            lines.append(f"  step {e['step']} epoch {e['epoch']}: loss {e['loss']:.6f}, accuracy "
                         f"{e['accuracy']:.4f} over {e['samples']} samples")
    lines.append("events" + ("" if events else ": none"))
    for e in events:
        lines.append(f"  step {e['step']} {e['kind']}: {e['message']}")
    out.write("\n".join(lines) + "\n")


def main(argv=None):
    """The command line; returns the exit status."""
    ap = argparse.ArgumentParser(prog="retrace_trace.py",
                                 description="Print a retrace trace (python reader of run/trace.rtrace).")
    ap.add_argument("trace", help="a trace file or a run directory (RUN/trace.rtrace)")
    ap.add_argument("--json", action="store_true", help="print the JSON view, as `retrace inspect --json`")
    ap.add_argument("--layout", default=None, help="frame_layout.json to use (default: found as documented)")
    ap.add_argument("--schema", default=None, help="trace.capnp to use (default: found as documented)")
    args = ap.parse_args(argv)
    path = args.trace
    if os.path.isdir(path):
        path = os.path.join(path, RUN_TRACE_FILE)
    try:
        trace = open_trace(path, layout_path=args.layout, schema_path=args.schema)
        if trace.tail_warning:
            sys.stderr.write(f"warning: {trace.tail_warning}\n")
        if args.json:
            text = json.dumps(trace.to_json(), indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False)
            sys.stdout.buffer.write(text.encode("utf-8") + b"\n")
            sys.stdout.buffer.flush()
        else:
            import io
            buf = io.StringIO()
            _print_table(trace, buf)
            sys.stdout.buffer.write(buf.getvalue().encode("utf-8"))
            sys.stdout.buffer.flush()
    except TraceError as e:
        sys.stderr.write(f"retrace_trace: {e}\n")
        return EXIT_CORRUPT
    except BrokenPipeError:
        return EXIT_OK
    except (OSError, LayoutError) as e:
        if isinstance(e, OSError) and e.filename is not None:
            msg = f"cannot open {e.filename}: {e.strerror}"
        else:
            msg = str(e)
        sys.stderr.write(f"retrace_trace: {msg}\n")
        return EXIT_ENVIRONMENT
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
