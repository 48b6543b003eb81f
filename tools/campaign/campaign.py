#!/usr/bin/env python3
"""The standing fault campaign against retrace's checkpoints and traces.

  tools/campaign/campaign.py RETRACE [--smoke [--quick] | --long] [--work DIR] [--kills N] [--seed S]
                             [--only TEXT ...] [--shim LIB]

(a) kills: a run is SIGKILLed at random moments (many of them inside checkpoint saves and
    rotation, which every step does here), then resumed; every resume must load an untorn
    checkpoint, no committed checkpoint may be lost, and the finished trace must end on the same
    hash chain as the uninterrupted run (bitwise resume).
(b) damage: every file of a recorded run (trace, config, LATEST, each manifest and shard) is
    flipped, truncated, extended with garbage or zeros, deleted, replaced by a FIFO or a link,
    spliced (frames swapped, duplicated, dropped; a shard of another step) or resealed (a
    manifest edited with a valid checksum). Then `verify`, `inspect` and `resume` run on a copy.
    Each case must be detected with a documented exit code, or accepted by design (a damaged
    hint, a damaged old checkpoint that resume steps over, a tail after the last frame), and
    never crash (exit 70, a signal, a hang) or lose a checkpoint it did not damage.

(c) hostile inputs (issue 54): two writers of one run in each form (two overlapping resumes, a
    resume while the record runs, `record --force` over a live run): the second must be refused
    (exit 4) and the run end on the uninterrupted run's chain; negative, zero, out-of-range and
    malformed values of every number flag (exit 2 naming the flag); a subnormal in every float
    key of the config (read exactly or refused, never exit 70), through --set, a --config file and
    an edited RUN/config.toml; traces cut at several positions around each checkpoint (resume
    falls back to the newest checkpoint within the intact trace, bitwise); a checkpoint's tensor
    table permuted and resealed (verify must refuse what a load refuses).
(d) background saves (issue 52): runs saving every 5 steps in the background on one and two
    ranks, on a disk the failing_io shim makes slow, are SIGKILLed at random moments (mostly with a
    save in flight), and others meet a full, failing or read-only disk under a random save and
    rank with either checkpoint.on_error; nothing committed may be torn or lost, LATEST never
    names an uncommitted save, and every run ends (resumed where it stopped) on the chain of a
    run without the fault.

Prints one line per trial and ends with the summary line
  campaign: trials T, detected D, accepted by design A, missed 0, crashed 0, lost checkpoints 0
and exits 1 when anything was missed, crashed or lost. Standard library only.
"""

import argparse
import json
import hashlib
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

EXIT_OK, EXIT_CORRUPT = 0, 3
DOCUMENTED = {0, 1, 2, 3, 4}


class Campaign:
    def __init__(self, retrace, work, rng):
        self.retrace, self.work, self.rng = retrace, work, rng
        self.counts = dict(trials=0, detected=0, accepted=0, missed=0, crashed=0, lost=0)
        self.failures = []

    def run(self, args, timeout=120, env=None):
        try:
            p = subprocess.run([self.retrace] + args, capture_output=True, text=True, errors="replace",
                               timeout=timeout, env=env)
            return p.returncode, p.stdout + p.stderr
        except subprocess.TimeoutExpired:
            return 124, "timed out"

    def record(self, out, extra=()):
        rc, text = self.run(["record", "--out", out, "--force", "--plain", "--total-steps", "40",
                             "--set", "checkpoint.every_steps=10", "--set", "train.eval_each_epoch=false",
                             "--set", "model.hidden=[32]", *extra])
        if rc not in (0,):
            raise SystemExit(f"campaign: base run failed ({rc}):\n{text[-2000:]}")

    def verdict(self, name, outcome, detail):
        self.counts["trials"] += 1
        self.counts[outcome] += 1
        print(f"{outcome:9s} {name}: {detail}", flush=True)
        if outcome in ("missed", "crashed", "lost"):
            self.failures.append(f"{name}: {detail}")

    # ------------------------------------------------------------------ (b) damage
    def damage(self, smoke, quick=False, only=None):
        base = os.path.join(self.work, "base")
        self.record(base, ["--interrupt-at", "30"])  # checkpoints 10, 20, 30; resume runs 31..40
        ck = os.path.join(base, "checkpoints")
        steps = sorted(d for d in os.listdir(ck) if d.startswith("step-"))
        newest, older = steps[-1], steps[:-1]
        files = ["trace.rtrace", "config.toml", "checkpoints/LATEST"]
        for s in steps:
            files += [f"checkpoints/{s}/manifest.json", f"checkpoints/{s}/shard-rank00000.safetensors"]
        positions = 3 if smoke else 24
        cases = []
        for rel in files:
            size = os.path.getsize(os.path.join(base, rel))
            for i in range(positions):
                at = (size - 1) * i // max(1, positions - 1)
                cases.append((f"flip {rel} @{at}", rel, ("flip", at)))
            for cut in sorted({0, size // 2, size - 1}):
                cases.append((f"truncate {rel} to {cut}", rel, ("truncate", cut)))
            cases.append((f"garbage after {rel}", rel, ("append", bytes(self.rng.randrange(256) for _ in range(100)))))
            cases.append((f"zeros after {rel}", rel, ("append", b"\0" * 4096)))
            cases.append((f"delete {rel}", rel, ("delete",)))
            cases.append((f"fifo for {rel}", rel, ("fifo",)))
        for s in steps:
            m = f"checkpoints/{s}/manifest.json"
            for label, edit in [("step+1", lambda j: j.update(step=j["step"] + 1)),
                                ("world_size 2", lambda j: j.update(world_size=2)),
                                ("huge trace_position", lambda j: j.update(trace_position=1 << 60)),
                                ("trace_position 17", lambda j: j.update(trace_position=17)),
                                ("other chain", lambda j: j.update(trace_chain_hex="ab" * 16)),
                                ("schema ckpt.v3", lambda j: j.update(schema="ckpt.v3")),
                                ("shard sha256", lambda j: j["shards"][0].update(sha256="0" * 64)),
                                ("shard ../ path", lambda j: j["shards"][0].update(file="../x.safetensors")),
                                ("extra value", lambda j: j["extra"].update(x="\udcff"))]:
                cases.append((f"reseal {m}: {label}", m, ("reseal", edit)))
            if s != steps[0]:
                cases.append((f"splice shard of {steps[0]} into {s}", f"checkpoints/{s}/shard-rank00000.safetensors",
                              ("copy", f"checkpoints/{steps[0]}/shard-rank00000.safetensors")))
                cases.append((f"link {s} -> {steps[0]}", f"checkpoints/{s}", ("dirlink", f"{steps[0]}")))
        # A shard's metadata or RNG bytes edited, the manifest resealed to match (size, sha256, checksum).
        hostile = [("samples_seen", "18446744073709551615"), ("samples_seen", "-5"), ("step", "abc"),
                   ("x.data.set_aside", "garbage"), ("x.spike_guard.losses", " ".join(str(i) for i in range(1, 25))),
                   ("x.spike_guard.losses", " ".join(str(i) for i in range(1, 21))),
                   ("x.skip_guard.outcomes", "0" * 5000), ("x.scaler.scale_bits", "4294967295"),
                   ("x.scaler.growth_tracker", "-1"), ("trace_position", "17"), ("rng", "1")]
        for s in (steps[-1], steps[-2]):
            for key, value in hostile:
                cases.append((f"reseal shard of {s}: {key}={value[:24]}", f"checkpoints/{s}/shard-rank00000.safetensors",
                              ("reseal-shard", key, value)))
        # Malformed numbers in every metadata field of the newest shard, resealed: each must be
        # refused (or, for a field that is not a number, be seen as another config or run).
        shard = f"checkpoints/{newest}/shard-rank00000.safetensors"
        keys = self.metadata_keys(os.path.join(base, shard))
        bad_numbers = ["a:b", "-1", " 7", "1e3", "99999999999999999999999", ""]
        for i, key in enumerate(keys):
            for value in (bad_numbers if not smoke else [bad_numbers[i % len(bad_numbers)]]):
                cases.append((f"reseal shard of {newest}: {key}={value!r}", shard, ("reseal-shard", key, value)))
        # A tensor resized (to 0 elements, or half its length), or retyped (F32 as I32, the same
        # bytes), and an RNG state whose torch CPU generator state is cut to 16 bytes: shard,
        # manifest table and checksums all resealed to match, so only the values can tell.
        for s in (steps[-1],) if smoke else (steps[-1], steps[-2]):
            shard = f"checkpoints/{s}/shard-rank00000.safetensors"
            names = self.tensor_names(os.path.join(base, shard))
            step_t = next(n for n in names if n.endswith("/step"))
            moment = next(n for n in names if n.endswith("/exp_avg"))
            model_t = next(n for n in names if n.startswith("model/"))
            for op in [("resize", step_t, 0), ("resize", step_t, 2), ("resize", moment, 0), ("resize", moment, "half"),
                       ("resize", model_t, "half"), ("dtype", moment, "I32"), ("dtype", step_t, "F64"),
                       ("dtype", model_t, "I32"), ("rng-cpu", "rng/state", 16), ("rng-cpu", "rng/state", 0)]:
                cases.append((f"reseal tensor of {s}: {op[0]} {op[1]} {op[2]}", shard, ("reseal-tensor",) + op))
        # Every file of the run replaced by a link to an identical copy outside the checkpoint (the
        # bytes verify; the link must not be followed), and the trace header's reserved bytes.
        for rel in files:
            cases.append((f"link for {rel}", rel, ("outlink",)))
        for at in (8, 15):
            cases.append((f"trace header reserved byte {at}", "trace.rtrace", ("setbyte", at, 1)))
        for how in ("swap", "duplicate", "drop", "reseal-loss"):
            cases.append((f"trace frames: {how}", "trace.rtrace", ("frames", how)))

        if only:
            cases = [c for c in cases if any(o in c[0] for o in only)]
        if quick:
            # CI's size: every third case, and the first case of every kind of damage to every kind
            # of file that the third would leave out, so no class goes untried (docs/reliability.md
            # has the full sizes, run by hand).
            def kind(case):
                name, rel, op = case
                what = "trace" if rel.startswith("trace") else rel.rsplit("/", 1)[-1].split("-")[0]
                detail = op[1] if op[0] in ("reseal-tensor", "frames", "setbyte") else ""
                if op[0] == "reseal":
                    detail = name.rsplit(": ", 1)[-1]
                return (op[0], what, detail)
            kept, seen = [], set()
            for i, case in enumerate(cases):
                if i % 3 == 0 or kind(case) not in seen:
                    kept.append(case)
                seen.add(kind(case))
            print(f"quick: {len(kept)} of the {len(cases)} damage cases (every third, and each kind at least once)")
            cases = kept
        for name, rel, op in cases:
            run = os.path.join(self.work, "case")
            shutil.rmtree(run, ignore_errors=True)
            shutil.copytree(base, run, symlinks=True)
            before = self.committed(run)
            try:
                self.apply(run, rel, op)
            except Exception as e:  # a mutation that does not apply to this file
                print(f"skip      {name}: {e}")
                continue
            damaged_ckpt = rel.startswith("checkpoints/step-")
            target = rel.split("/")[1] if damaged_ckpt else None
            results = []
            if damaged_ckpt:
                rc, text = self.run(["verify", os.path.join(run, "checkpoints", target), "--json"])
                results.append(("verify", rc, text))
                # What a checkpoint says about the trace (position, chain) only a load can check:
                # re-execute one step from this very checkpoint.
                step = int(target.split("-")[1])
                rc, text = self.run(["replay", run, "--from-checkpoint", str(step), "--steps",
                                     f"{step + 1}:{step + 1}", "--quiet", "--out", os.path.join(run, "replay")])
                results.append(("replay", rc, text))
            if rel == "trace.rtrace":
                rc, text = self.run(["inspect", os.path.join(run, "trace.rtrace")])
                results.append(("inspect", rc, text))
            rc, text = self.run(["resume", run, "--plain"])
            results.append(("resume", rc, text))
            self.judge(name, rel, target, newest, results, before, run)

    def judge(self, name, rel, target, newest, results, before, run):
        for cmd, rc, text in results:
            if rc not in DOCUMENTED:
                last = [l for l in text.strip().splitlines() if l][-1:] or [""]
                return self.verdict(name, "crashed", f"{cmd} exit {rc}: {last[0][:160]}")
        lost = [s for s in before if s != target and s not in self.committed(run)]
        if lost:
            return self.verdict(name, "lost", f"committed checkpoints gone: {', '.join(lost)}")
        for cmd, rc, text in results:
            if rc != 0:
                first = [l for l in text.splitlines() if l.startswith("retrace:") or "FAILED" in l or '"error"' in l][:1]
                return self.verdict(name, "detected", f"{cmd} exit {rc}: {(first or [''])[0].strip()[:150]}")
        text = {cmd: t for cmd, _, t in results}
        why = "resume fell back to an older checkpoint" if "skipped checkpoint" in text["resume"] else "resume ran"
        if rel == "checkpoints/LATEST":
            return self.verdict(name, "accepted", "LATEST is a hint, never trusted; " + why)
        if name == "link for config.toml":
            return self.verdict(name, "accepted", "the config is only read, and its hash must be the checkpoint's and "
                                "the trace's; " + why)
        if rel == "trace.rtrace" and "warning" in text.get("inspect", "") + text["resume"]:
            return self.verdict(name, "accepted", "a damaged tail after the last complete frame, kept aside; " + why)
        if self.same_content(run, rel):
            return self.verdict(name, "accepted", "only trailing whitespace changed; " + why)
        return self.verdict(name, "missed", "no command noticed; " + why)

    def same_content(self, run, rel):
        # A manifest that differs only by trailing whitespace (its last newline cut) says the same.
        a, b = os.path.join(self.work, "base", rel), os.path.join(run, rel)
        if not (os.path.isfile(a) and os.path.isfile(b)) or os.path.islink(b):
            return False
        with open(a, "rb") as x, open(b, "rb") as y:
            return x.read().rstrip() == y.read().rstrip()

    def config_changed(self, run):
        with open(os.path.join(self.work, "base", "config.toml"), "rb") as a, \
                open(os.path.join(run, "config.toml"), "rb") as b:
            return a.read() != b.read()

    def committed(self, run, after=False):
        ck = os.path.join(run, "checkpoints")
        out = set()
        if not os.path.isdir(ck):
            return out
        for d in os.listdir(ck):
            p = os.path.join(ck, d)
            if d.startswith("step-") and not os.path.islink(p) and os.path.isfile(os.path.join(p, "manifest.json")):
                out.add(d)
        return out

    def apply(self, run, rel, op):
        path = os.path.join(run, rel)
        kind = op[0]
        if kind == "flip":
            with open(path, "r+b") as f:
                f.seek(op[1])
                b = f.read(1)
                f.seek(op[1])
                f.write(bytes([b[0] ^ 0x5a]))
        elif kind == "truncate":
            os.truncate(path, op[1])
        elif kind == "append":
            with open(path, "ab") as f:
                f.write(op[1])
        elif kind == "delete":
            os.remove(path)
        elif kind == "fifo":
            os.remove(path)
            os.mkfifo(path)
        elif kind == "copy":
            shutil.copyfile(os.path.join(run, op[1]), path)
        elif kind == "dirlink":
            shutil.rmtree(path)
            os.symlink(op[1], path)
        elif kind == "reseal":
            with open(path, "rb") as f:
                j = json.loads(f.read().decode("utf-8", "surrogateescape"))
            op[1](j)
            j.pop("manifest_sha256", None)
            canon = json.dumps(j, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
            raw = canon.encode("utf-8", "surrogateescape")
            j["manifest_sha256"] = hashlib.sha256(raw).hexdigest()
            with open(path, "wb") as f:
                f.write(json.dumps(j, sort_keys=True, indent=2, ensure_ascii=False).encode("utf-8", "surrogateescape"))
        elif kind == "reseal-shard":
            self.reseal_shard(path, op[1], op[2])
        elif kind == "frames":
            self.edit_frames(path, op[1])
        elif kind == "reseal-tensor":
            self.reseal_tensor(path, *op[1:])
        elif kind == "outlink":
            outside = os.path.join(os.path.dirname(run), "outside-" + os.path.basename(path))
            shutil.copyfile(path, outside)
            os.remove(path)
            os.symlink(outside, path)
        elif kind == "setbyte":
            with open(path, "r+b") as f:
                f.seek(op[1])
                f.write(bytes([op[2]]))
        else:
            raise ValueError(kind)

    @staticmethod
    def reseal_shard(path, key, value):
        with open(path, "rb") as f:
            b = f.read()
        n = struct.unpack_from("<Q", b, 0)[0]
        header = json.loads(b[8:8 + n])
        data = bytearray(b[8 + n:])
        if key == "rng":
            lo, hi = header["rng/state"]["data_offsets"]
            r = random.Random(int(value))
            for i in range(lo, hi):
                data[i] = r.randrange(256)
        else:
            header["__metadata__"][key] = value
        Campaign.write_resealed(path, header, bytes(data))

    @staticmethod
    def write_resealed(path, header, data, edit_manifest=None):
        """Writes a shard (its JSON header, metadata included, then the data) and reseals its
        manifest: the shard's size and sha256, what edit_manifest changes, the manifest checksum."""
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * ((8 - len(text) % 8) % 8)
        new = struct.pack("<Q", len(text)) + text + data
        with open(path, "wb") as f:
            f.write(new)
        manifest = os.path.join(os.path.dirname(path), "manifest.json")
        with open(manifest) as f:
            j = json.load(f)
        j["shards"][0].update(size=len(new), sha256=hashlib.sha256(new).hexdigest())
        if edit_manifest:
            edit_manifest(j)
        j.pop("manifest_sha256", None)
        canon = json.dumps(j, sort_keys=True, separators=(",", ":"))
        j["manifest_sha256"] = hashlib.sha256(canon.encode()).hexdigest()
        with open(manifest, "w") as f:
            f.write(json.dumps(j, sort_keys=True, indent=2))

    @staticmethod
    def read_shard(path):
        with open(path, "rb") as f:
            b = f.read()
        n = struct.unpack_from("<Q", b, 0)[0]
        return json.loads(b[8:8 + n]), b[8 + n:]

    def metadata_keys(self, path):
        return sorted(self.read_shard(path)[0]["__metadata__"])

    def tensor_names(self, path):
        return sorted(k for k in self.read_shard(path)[0] if k != "__metadata__")

    @staticmethod
    def reseal_tensor(path, how, name, arg):
        """Rewrites one tensor of a shard (resized, retyped or, for the RNG state, its torch CPU
        generator state cut), the other tensors kept, then reseals the manifest: the shard's size
        and sha256, the table's dtype, shape and piece of that tensor, and the manifest checksum."""
        header, data = Campaign.read_shard(path)
        meta = header.pop("__metadata__")
        order = sorted(header, key=lambda k: header[k]["data_offsets"][0])
        blobs = {k: data[header[k]["data_offsets"][0]:header[k]["data_offsets"][1]] for k in order}
        t = header[name]
        size = {"F32": 4, "I32": 4, "F64": 8, "I64": 8, "U8": 1}
        if how == "resize":
            count = len(blobs[name]) // size[t["dtype"]]
            new_count = count // 2 if arg == "half" else arg
            blobs[name] = blobs[name][:new_count * size[t["dtype"]]] + b"\0" * max(0, new_count - count) * size[t["dtype"]]
            t["shape"] = [new_count]
        elif how == "dtype":
            count = len(blobs[name]) // size[t["dtype"]]
            t["dtype"] = arg
            blobs[name] = (blobs[name] * 2)[:count * size[arg]]
        else:  # rng-cpu: magic, version, seed, then the CPU generator's bytes (a u64 length first)
            b = blobs[name]
            n = struct.unpack_from("<Q", b, 24)[0]
            blobs[name] = b[:24] + struct.pack("<Q", arg) + b[32:32 + arg] + b[32 + n:]
            t["shape"] = [len(blobs[name])]
        offset, out = 0, b""
        for k in order:
            header[k]["data_offsets"] = [offset, offset + len(blobs[k])]
            offset += len(blobs[k])
            out += blobs[k]
        header["__metadata__"] = meta
        elements = len(blobs[name]) // size[t["dtype"]]

        def table(j):
            for entry in j.get("tensors", []):
                if entry["name"] == name:
                    entry.update(dtype=t["dtype"], shape=t["shape"],
                                 pieces=[{"rank": 0, "begin": 0, "end": elements}] if elements else [])
        Campaign.write_resealed(path, header, out, table)

    @staticmethod
    def frames_of(data):
        pos, out = 16, []
        while pos + 32 <= len(data):
            kind = data[pos + 4]
            clen = struct.unpack_from("<I", data, pos + 16)[0]
            out.append((pos, 32 + clen, kind))
            pos += 32 + clen
        return out

    def edit_frames(self, path, how):
        with open(path, "rb") as f:
            data = f.read()
        steps = [(o, n) for o, n, k in self.frames_of(data) if k == 2]
        if len(steps) < 4:
            raise ValueError("too few step frames")
        a, b = steps[len(steps) // 2], steps[len(steps) // 2 + 1]
        fa, fb = data[a[0]:a[0] + a[1]], data[b[0]:b[0] + b[1]]
        if how == "swap":
            data = data[:a[0]] + fb + fa + data[b[0] + b[1]:]
        elif how == "duplicate":
            data = data[:b[0]] + fa + data[b[0]:]
        elif how == "drop":
            data = data[:a[0]] + data[a[0] + a[1]:]
        else:  # a step frame's bytes edited and its frame checksum recomputed: only the chain can tell
            raise ValueError("needs the frame checksum (xxh3), not in the standard library")
        with open(path, "wb") as f:
            f.write(data)

    # ------------------------------------------------------------------ (a) kills
    def kills(self, n):
        ref = os.path.join(self.work, "kill-ref")
        # A checkpoint after every step and rotation down to 2: most moments are inside a save.
        extra = ["--set", "checkpoint.every_steps=1", "--set", "checkpoint.keep_last=2", "--set", "model.hidden=[256]"]
        self.record(ref, extra)
        ref_chain = self.final_chain(ref)
        for i in range(n):
            name = f"kill {i + 1}/{n}"
            run = os.path.join(self.work, "kill")
            shutil.rmtree(run, ignore_errors=True)
            args = [self.retrace, "record", "--out", run, "--plain", "--total-steps", "40",
                    "--set", "checkpoint.every_steps=10", "--set", "train.eval_each_epoch=false",
                    "--set", "model.hidden=[32]", *extra]
            p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(self.rng.uniform(0.6, 2.4))  # the process start (and the re-exec), then steps
            p.send_signal(signal.SIGKILL)
            p.wait()
            if not os.path.isfile(os.path.join(run, "config.toml")):
                self.verdict(name, "accepted", "killed before the run directory existed (none was left half-made)"
                             if not os.path.exists(run) else "killed before the run directory existed")
                continue
            # Every committed checkpoint (one with a manifest) must verify: a kill never tears one.
            why = self.untorn(run)
            if why:
                self.verdict(name, "lost", why)
                continue
            self.judge_resume(name, run, ref_chain)

    def judge_resume(self, name, run, ref_chain, args=(), done=""):
        """Resumes a killed run: it must continue from a checkpoint (or say there is none yet) and end
        on the uninterrupted run's chain; skipping an interrupted save on the way is detection."""
        rc, text = self.run(["resume", run, "--plain", *args])
        if rc == 3 and "no complete checkpoint" in text:
            self.verdict(name, "accepted", "killed before the first checkpoint: nothing to resume")
        elif rc != 0:
            self.verdict(name, "crashed" if rc not in DOCUMENTED else "missed",
                         f"resume exit {rc}: {text.strip().splitlines()[-1][:160] if text.strip() else ''}")
        elif self.final_chain(run) != ref_chain:
            self.verdict(name, "missed", "the resumed trace ends on another chain digest than the uninterrupted run")
        else:
            skipped = "skipped checkpoint" in text
            self.verdict(name, "detected" if skipped else "accepted",
                         done + "resumed bitwise" + (" past an interrupted save" if skipped else ""))

    # ------------------------------------------------------------------ (d) background saves
    # Runs that save every 5 steps in the background (checkpoint.async, the default), on one rank
    # and on two, on a disk made slow (the failing_io shim's RETRACE_SLOW_PATH: each shard write
    # takes 0.3 s), so that a save is in flight at most moments: kills at random moments, and a
    # full, failing or read-only disk under a random save, rank, and checkpoint.on_error.
    ASYNC = ["--total-steps", "40", "--set", "checkpoint.every_steps=5", "--set", "checkpoint.keep_last=2",
             "--set", "train.eval_each_epoch=false", "--set", "model.hidden=[256]"]

    def async_ref(self, world):
        ref = os.path.join(self.work, f"async-ref-{world}")
        if not os.path.isdir(ref):
            rc, text = self.run(["record", "--out", ref, "--plain", "--world-size", str(world), *self.ASYNC])
            if rc != 0:
                raise SystemExit(f"campaign: base run failed ({rc}):\n{text[-2000:]}")
        return self.final_chain(ref)

    def untorn(self, run):
        """Why the run's checkpoints are not as a kill may leave them (None: they are): a committed one
        that does not verify, or LATEST naming one that is not committed."""
        for d in sorted(self.committed(run)):
            rc, text = self.run(["verify", os.path.join(run, "checkpoints", d)])
            if rc != 0:
                return f"{d} committed but torn ({text.strip().splitlines()[-1][:120]})"
        latest = os.path.join(run, "checkpoints", "LATEST")
        if os.path.isfile(latest):
            named = open(latest).read().strip()
            if named not in self.committed(run):
                return f"LATEST names {named}, which is not committed"
        return None

    def async_kills(self, n, shim):
        for i in range(n):
            world = 1 + i % 2
            name = f"async kill {i + 1}/{n} ({world} rank{'s' if world > 1 else ''})"
            ref_chain = self.async_ref(world)
            run = os.path.join(self.work, "async-kill")
            shutil.rmtree(run, ignore_errors=True)
            env = dict(os.environ, LD_PRELOAD=shim, RETRACE_SLOW_PATH="shard-rank", RETRACE_SLOW_US="300000")
            log = os.path.join(self.work, "async-kill.log")
            with open(log, "w") as out:
                p = subprocess.Popen([self.retrace, "record", "--out", run, "--plain", "--world-size", str(world),
                                      *self.ASYNC], stdout=out, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)  # the launcher and its ranks, killed as one
                time.sleep(self.rng.uniform(1.0 * world, 2.5 + 1.5 * world))  # a 2-rank start takes about 2 s
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            if not os.path.isfile(os.path.join(run, "config.toml")):
                self.verdict(name, "accepted", "killed before the run directory existed")
                continue
            why = self.untorn(run)
            reported = [line.split("checkpoint ", 1)[1].split(" (")[0] for line in open(log, errors="replace")
                        if "in the background; the loop was blocked" in line]
            if not why and reported and os.path.basename(reported[-1]) not in self.committed(run):
                why = f"{reported[-1]} was reported committed and is gone"
            if why:
                self.verdict(name, "lost", why)
                continue
            self.judge_resume(name, run, ref_chain, ["--world-size", str(world)],
                              f"killed with {len(reported)} background save(s) reported; ")

    def async_disk_faults(self, n, shim):
        for i in range(n):
            world = 1 + i % 2
            step = self.rng.choice(range(5, 40, 5))
            fault = self.rng.choice(["ENOSPC", "EIO", "EROFS"])
            on_error = self.rng.choice(["stop", "continue"])
            rank = self.rng.choice(["", "00000", "00001"][:world + 1])
            where = f"rank {int(rank)}" if rank else "every rank"
            name = f"async disk {i + 1}/{n}: {fault} at step {step} on {where} of {world}, on_error {on_error}"
            ref_chain = self.async_ref(world)
            run = os.path.join(self.work, "async-disk")
            shutil.rmtree(run, ignore_errors=True)
            env = dict(os.environ, LD_PRELOAD=shim, RETRACE_FAIL_PATH=f"step-{step:08d}/shard-rank{rank}",
                       RETRACE_FAIL_ERRNO=fault, RETRACE_FAIL_AFTER=str(self.rng.randrange(0, 200000)))
            try:
                p = subprocess.run([self.retrace, "record", "--out", run, "--plain", "--world-size", str(world),
                                    *self.ASYNC, "--set", f"checkpoint.on_error={on_error}"], env=env,
                                   capture_output=True, text=True, errors="replace", timeout=300)
                rc, text = p.returncode, p.stdout + p.stderr
            except subprocess.TimeoutExpired:
                rc, text = 124, "timed out"
            want_rc = 0 if on_error == "continue" else 4
            said = f"background save of step {step} failed"
            if rc != want_rc or said not in text:
                self.verdict(name, "crashed" if rc not in DOCUMENTED else "missed",
                             f"exit {rc} (wanted {want_rc} saying '{said}'): "
                             f"{text.strip().splitlines()[-1][:160] if text.strip() else ''}")
                continue
            why = self.untorn(run)
            if not why and f"step-{step:08d}" in self.committed(run):
                why = f"step {step} is committed although its save failed"
            if why:
                self.verdict(name, "lost", why)
                continue
            if on_error == "stop":
                rc, text = self.run(["resume", run, "--plain", "--world-size", str(world)])
                if rc == 3 and "no complete checkpoint" in text and step == 5:
                    self.verdict(name, "detected", "stopped cleanly at the first save: nothing to resume from")
                    continue
                if rc != 0:
                    self.verdict(name, "crashed" if rc not in DOCUMENTED else "missed",
                                 f"resume exit {rc}: {text.strip().splitlines()[-1][:160] if text.strip() else ''}")
                    continue
            if self.final_chain(run) != ref_chain:
                self.verdict(name, "missed", "the trace ends on another chain digest than the run without the fault")
                continue
            self.verdict(name, "detected", "stopped cleanly and resumed bitwise" if on_error == "stop"
                         else "trained on past the failed save, bitwise")

    # ------------------------------------------------------------------ (c) hostile inputs
    def hostile(self, smoke):
        self.concurrent_writers()
        self.number_flags(smoke)
        self.subnormals(smoke)
        self.cut_traces(smoke)
        self.permuted_tables()

    @staticmethod
    def wait_writing(run, p, timeout=60):
        """Waits until the writer `p` holds `run`'s lock and the trace exists; False if it ended first."""
        end = time.time() + timeout
        while time.time() < end and p.poll() is None:
            if os.path.exists(os.path.join(run, ".retrace-lock")) and os.path.exists(os.path.join(run, "trace.rtrace")):
                return True
            time.sleep(0.02)
        return False

    def concurrent_writers(self):
        # Long enough (about 2 s here) that the second writer starts while the first one writes.
        base = ["--plain", "--total-steps", "200", "--set", "model.hidden=[256,256]", "--set",
                "checkpoint.every_steps=5", "--set", "train.eval_each_epoch=false"]
        ref = os.path.join(self.work, "writers-ref")
        rc, text = self.run(["record", "--out", ref, "--force", *base])
        if rc != 0:
            raise SystemExit(f"campaign: base run failed ({rc}):\n{text[-2000:]}")
        ref_chain = self.final_chain(ref)
        forms = [("two overlapping resumes", ["--interrupt-at", "5"], ["resume", "{run}", "--plain"],
                  ["resume", "{run}", "--plain"]),
                 ("a resume while the record runs", [], ["record", "--out", "{run}", *base],
                  ["resume", "{run}", "--plain"]),
                 ("record --force over a live record", [], ["record", "--out", "{run}", *base],
                  ["record", "--out", "{run}", "--force", *base])]
        for name, prepare, first, second in forms:
            run = os.path.join(self.work, "writers")
            shutil.rmtree(run, ignore_errors=True)
            if prepare:
                rc, text = self.run(["record", "--out", run, *base, *prepare])
                if rc != 0:
                    raise SystemExit(f"campaign: base run failed ({rc}):\n{text[-2000:]}")
            fill = lambda args: [a.replace("{run}", run) for a in args]
            p = subprocess.Popen([self.retrace] + fill(first), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True, errors="replace")
            live = self.wait_writing(run, p)
            rc2, text2 = self.run(fill(second))
            try:
                out1, _ = p.communicate(timeout=300)
            except subprocess.TimeoutExpired:
                p.kill()
                out1, _ = p.communicate()
            rc1 = p.returncode
            if rc1 not in DOCUMENTED or rc2 not in DOCUMENTED:
                self.verdict(f"writers: {name}", "crashed", f"exit {rc1} and {rc2}")
                continue
            chain = self.final_chain(run)
            if not live:
                ok = rc1 == 0 and rc2 == 0 and chain == ref_chain
                self.verdict(f"writers: {name}", "accepted" if ok else "missed",
                             "the first writer ended before the second began; " +
                             ("both ran, the run is whole" if ok else f"exits {rc1}, {rc2}, chain equal: {chain == ref_chain}"))
                continue
            if rc2 == 4 and "being written by another process" in text2 and rc1 == 0 and chain == ref_chain:
                self.verdict(f"writers: {name}", "detected", "the second writer exit 4 naming the holder; the run ends "
                             "on the uninterrupted run's chain")
            else:
                last = (text2.strip().splitlines() or [""])[-1][:140]
                self.verdict(f"writers: {name}", "missed", f"first exit {rc1}, second exit {rc2} ({last}); chain "
                             f"{'equal' if chain == ref_chain else 'differs'}")

    def number_flags(self, smoke):
        run = os.path.join(self.work, "flags")
        rc, _ = self.run(["record", "--out", run, "--force", "--plain", "--total-steps", "4", "--set",
                          "model.hidden=[32]", "--set", "checkpoint.every_steps=2", "--set", "train.eval_each_epoch=false"])
        ck = os.path.join(run, "checkpoints", "step-00000004")
        cases = []
        for flag, values in [("--steps", ["-1", "0", "2x", "1e30", "99999999999999999999"]),
                             ("--interrupt-at", ["-1", "0"]), ("--checkpoint-at", ["-3", "0"]),
                             ("--world-size", ["-1", "0", "70000", "1.5"]), ("--resume-world-size", ["-2"]),
                             ("--accum-grid", ["0,2", "-1"])]:
            for v in values:
                cases.append((["record", "--out", os.path.join(self.work, "flags-no"), flag, v], flag))
        for flag, values in [("--interrupt-at", ["-1", "0"]), ("--world-size", ["-1", "0"]), ("--zero-stage", ["-1", "2"])]:
            for v in values:
                cases.append((["resume", run, flag, v], flag))
        cases += [(["verify", ck, "--world-size", "-1"], "--world-size"),
                  (["replay", run, "--from-checkpoint", "-1"], "--from-checkpoint"),
                  (["replay", run, "--tolerance", "-1"], "--tolerance"), (["replay", run, "--tolerance", "nan"], "--tolerance"),
                  (["replay", run, "--tolerance", "inf"], "--tolerance"),
                  (["memory", "--rounds", "-1"], "--rounds"), (["memory", "--steps", "0"], "--steps"),
                  (["memory", "--world-size", "0"], "--world-size"),
                  (["golden", "update", "x", "--reason", "r", "--interrupt-at", "-5"], "--interrupt-at"),
                  (["inspect", run, "--steps", "-1:3"], "--steps")]
        if smoke:
            cases = cases[::2]
        for args, flag in cases:
            rc, text = self.run(args)
            name = "flag: " + " ".join(a if not a.startswith(self.work) else "DIR" for a in args)
            if rc not in DOCUMENTED:
                self.verdict(name, "crashed", f"exit {rc}")
            elif rc == 2 and flag in text:
                self.verdict(name, "detected", "exit 2: " + (text.strip().splitlines() or [""])[0][:120])
            else:
                self.verdict(name, "missed", f"exit {rc}: " + (text.strip().splitlines() or [""])[-1][:120])
        if os.path.exists(os.path.join(self.work, "flags-no")):
            self.verdict("flags: no run directory left behind", "missed", "a refused record made its directory")

    def float_keys(self):
        import tomllib
        rc, text = self.run(["record", "--print-config"])
        conf = tomllib.loads(text)
        keys = []
        def walk(t, prefix):
            for k, v in t.items():
                if isinstance(v, dict):
                    walk(v, prefix + k + ".")
                elif isinstance(v, float):
                    keys.append(prefix + k)
        walk(conf, "")
        return keys

    def subnormals(self, smoke):
        import tomllib
        for key in self.float_keys():
            for value in (("5e-324",) if smoke else ("5e-324", "1e-310", "2.2250738585072009e-308")):
                rc, text = self.run(["record", "--print-config", "--set", f"{key}={value}"])
                name = f"subnormal: --set {key}={value}"
                if rc not in DOCUMENTED:
                    self.verdict(name, "crashed", f"exit {rc}: {(text.strip().splitlines() or [''])[-1][:120]}")
                    continue
                if rc == 2:
                    self.verdict(name, "detected", "refused: " + (text.strip().splitlines() or [""])[-1][:120])
                    continue
                conf = tomllib.loads(text)
                section, _, leaf = key.rpartition(".")
                got = conf
                for part in section.split("."):
                    got = got[part]
                ok = rc == 0 and got[leaf] == float(value)
                self.verdict(name, "accepted" if ok else "missed", "read exactly and written back" if ok else
                             f"exit {rc}, written back as {got.get(leaf)!r}")
        # End to end: a run with one in --set, in a --config file, and in an edited RUN/config.toml.
        run = os.path.join(self.work, "subnormal")
        args = ["--plain", "--total-steps", "4", "--set", "model.hidden=[32]", "--set", "checkpoint.every_steps=2",
                "--set", "train.eval_each_epoch=false"]
        conf = os.path.join(self.work, "subnormal.toml")
        with open(conf, "w") as f:
            f.write("[train]\nmax_norm = 5e-324\n")
        for name, extra in [("--set optim.lr=1e-310", ["--set", "optim.lr=1e-310"]),
                            ("--config with train.max_norm = 5e-324", ["--config", conf])]:
            rc, text = self.run(["record", "--out", run, "--force", *args, *extra])
            self.verdict(f"subnormal: record {name}", "accepted" if rc == 0 else ("crashed" if rc not in DOCUMENTED else "missed"),
                         f"exit {rc}: " + (text.strip().splitlines() or [""])[-1][:120])
        rc, _ = self.run(["record", "--out", run, "--force", *args, "--interrupt-at", "2"])
        path = os.path.join(run, "config.toml")
        with open(path) as f:
            text = f.read()
        with open(path, "w") as f:
            f.write(text.replace("lr = 0.001", "lr = 1e-310", 1))
        rc, out = self.run(["resume", run, "--plain"])
        self.verdict("subnormal: an edited RUN/config.toml (lr = 1e-310) resumed",
                     "crashed" if rc not in DOCUMENTED else ("detected" if rc in (2, 3) else "missed"),
                     f"exit {rc}: " + (out.strip().splitlines() or [""])[-1][:140])

    def cut_traces(self, smoke):
        base = os.path.join(self.work, "cut-base")
        args = ["--plain", "--total-steps", "40", "--set", "checkpoint.every_steps=10", "--set",
                "train.eval_each_epoch=false", "--set", "model.hidden=[32]"]
        rc, text = self.run(["record", "--out", base, "--force", *args])
        ref_chain = self.final_chain(base)
        positions = []
        for d in sorted(os.listdir(os.path.join(base, "checkpoints"))):
            if d.startswith("step-"):
                with open(os.path.join(base, "checkpoints", d, "manifest.json")) as f:
                    positions.append((d, json.load(f)["trace_position"]))
        cuts = []
        for d, pos in positions:
            for delta, what in ((-1, "a byte before"), (0, "at"), (7, "7 bytes after")):
                cuts.append((f"{what} {d}'s position", pos + delta))
        cuts.append(("inside the header", 20))
        if smoke:
            cuts = cuts[:-1][::2] + cuts[-1:]
        first_pos = positions[0][1]
        for name, cut in cuts:
            run = os.path.join(self.work, "cut")
            shutil.rmtree(run, ignore_errors=True)
            shutil.copytree(base, run)
            os.truncate(os.path.join(run, "trace.rtrace"), cut)
            before = self.committed(run)
            rc, text = self.run(["resume", run, "--plain"])
            label = f"cut trace: {name} ({cut} bytes)"
            if rc not in DOCUMENTED:
                self.verdict(label, "crashed", f"exit {rc}")
            elif before - self.committed(run):
                self.verdict(label, "lost", "checkpoints gone: " + ", ".join(sorted(before - self.committed(run))))
            elif cut < first_pos:
                self.verdict(label, "detected" if rc == 3 else "missed",
                             f"exit {rc}: no checkpoint lies within the intact trace" if rc == 3 else f"exit {rc}")
            elif rc == 0 and self.final_chain(run) == ref_chain:
                self.verdict(label, "detected", "resumed by itself from the newest checkpoint within the intact trace, "
                             "bitwise")
            else:
                self.verdict(label, "missed", f"exit {rc}: " + (text.strip().splitlines() or [""])[-1][:140])
        # Two ranks: rank 0 judges the manifests against the trace, and the ranks agree before any
        # shard is read (one all-gather more per candidate).
        two = os.path.join(self.work, "cut-2")
        args2 = ["--plain", "--world-size", "2", "--total-steps", "12", "--set", "checkpoint.every_steps=4", "--set",
                 "train.eval_each_epoch=false", "--set", "model.hidden=[32]"]
        rc, text = self.run(["record", "--out", two, "--force", *args2])
        ref2 = self.final_chain(two)
        with open(os.path.join(two, "checkpoints", "step-00000012", "manifest.json")) as f:
            cut = json.load(f)["trace_position"] - 1
        with open(os.path.join(two, "checkpoints", "step-00000008", "manifest.json")) as f:
            cut = min(cut, json.load(f)["trace_position"] + 7)
        os.truncate(os.path.join(two, "trace.rtrace"), cut)
        rc, text = self.run(["resume", two, "--plain", "--world-size", "2"])
        label = f"cut trace: two ranks, 7 bytes after step-00000008's position ({cut} bytes)"
        if rc not in DOCUMENTED:
            self.verdict(label, "crashed", f"exit {rc}")
        elif rc == 0 and self.final_chain(two) == ref2 and "step-00000012" in text:
            self.verdict(label, "detected", "every rank passed over step-00000012 and resumed from step-00000008, bitwise")
        else:
            self.verdict(label, "missed", f"exit {rc}: " + (text.strip().splitlines() or [""])[-1][:140])

    def permuted_tables(self):
        base = os.path.join(self.work, "table-base")
        rc, text = self.run(["record", "--out", base, "--force", "--plain", "--world-size", "2", "--total-steps", "6",
                             "--set", "checkpoint.every_steps=3", "--set", "train.eval_each_epoch=false",
                             "--set", "model.hidden=[32]"])
        if rc != 0:
            raise SystemExit(f"campaign: base run failed ({rc}):\n{text[-2000:]}")
        step = "step-00000006"

        def rotate_names(t):
            names = [e["name"] for e in t]
            for e, n in zip(t, names[1:] + names[:1]):
                e["name"] = n
        def swap_pieces(t):
            t[0]["pieces"], t[1]["pieces"] = t[1]["pieces"], t[0]["pieces"]
        def swap_same_dtype_names(t):
            a = next(e for e in t if e["name"].startswith("optim/") and e["name"].endswith("exp_avg"))
            b = next(e for e in t if e["name"].startswith("optim/") and e["name"].endswith("exp_avg_sq")
                     and e["name"].rsplit("/", 1)[0] == a["name"].rsplit("/", 1)[0])
            a["name"], b["name"] = b["name"], a["name"]
        def reverse(t):
            t.reverse()
        def shift_offsets(t):
            for e in t:
                for p in e["pieces"]:
                    p["offset"] += 8 if p["rank"] == 1 else 0
        def piece_ranks(t):
            for e in t:
                for p in e["pieces"]:
                    p["rank"] = 1 - p["rank"]
        def reshape(t):
            e = next(e for e in t if len(e["shape"]) == 2)
            e["shape"] = [e["shape"][1], e["shape"][0]]
        def dtype(t):
            e = next(e for e in t if e["dtype"] == "F32")
            e["dtype"] = "I32"
        for label, edit in [("names rotated", rotate_names), ("two entries' pieces swapped", swap_pieces),
                            ("exp_avg and exp_avg_sq named the other way", swap_same_dtype_names),
                            ("entries in reverse order", reverse), ("rank 1's offsets moved", shift_offsets),
                            ("pieces given to the other rank", piece_ranks), ("a 2-d shape transposed", reshape),
                            ("a F32 tensor said to be I32", dtype)]:
            run = os.path.join(self.work, "table")
            shutil.rmtree(run, ignore_errors=True)
            shutil.copytree(base, run)
            m = os.path.join(run, "checkpoints", step, "manifest.json")
            with open(m) as f:
                j = json.load(f)
            edit(j["tensors"])
            j.pop("manifest_sha256", None)
            j["manifest_sha256"] = hashlib.sha256(json.dumps(j, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
            with open(m, "w") as f:
                f.write(json.dumps(j, sort_keys=True, indent=2))
            name = f"table of {step}: {label}"
            rc_v, text_v = self.run(["verify", os.path.dirname(m)])
            rc_j, text_j = self.run(["verify", os.path.dirname(m), "--json"])
            # What every rank's load says: a replay of one step from this checkpoint on 2 ranks.
            rc_l, text_l = self.run(["replay", run, "--from-checkpoint", "6", "--steps", "6:6", "--quiet", "--out",
                                     os.path.join(self.work, "table-replay"), "--force"])
            rc_r, text_r = self.run(["resume", run, "--plain", "--world-size", "2"])
            if any(rc not in DOCUMENTED for rc in (rc_v, rc_j, rc_l, rc_r)):
                self.verdict(name, "crashed", f"exits verify {rc_v}, --json {rc_j}, replay {rc_l}, resume {rc_r}")
            elif rc_v != rc_j:
                self.verdict(name, "missed", f"verify says {rc_v}, verify --json {rc_j}")
            elif rc_v == 3:
                self.verdict(name, "detected", "verify exit 3: " + [l for l in text_v.splitlines() if l.startswith("retrace:")][0][:140])
            elif "skipped checkpoint" in text_r and step in text_r:
                self.verdict(name, "missed", "verify says VERIFIED, the ranks' load skips it: " + text_r.strip().splitlines()[-1][:120])
            else:
                self.verdict(name, "accepted", "verify says VERIFIED and the ranks load it (the table says the same)")

    def final_chain(self, run):
        rc, text = self.run(["inspect", os.path.join(run, "trace.rtrace"), "--json"])
        if rc != 0:
            return None
        j = json.loads(text[text.index("{"):])
        return j["steps"][-1]["chain_digest"] if j.get("steps") else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("retrace")
    ap.add_argument("--smoke", action="store_true", help="a few cases of each kind (ctest: fault_campaign)")
    ap.add_argument("--quick", action="store_true", help="with --smoke: CI size, every third damage case (each kind at least once) and 2 kills")
    ap.add_argument("--long", action="store_true", help="the full damage set (as without --smoke: 24 positions a file, every malformed number) and 1000 kills")
    ap.add_argument("--kills", type=int, default=None)
    ap.add_argument("--work", default=None)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--only", action="append", default=None,
                    help="only the damage cases whose name contains this text (repeatable), and no kills")
    ap.add_argument("--classes", default="damage,kills,hostile,async",
                    help="which parts to run, comma-separated: damage, kills, hostile, async (default: all four)")
    ap.add_argument("--shim", default=None,
                    help="the failing_io library (tests/testing/failing_io.c) for the background-save trials; "
                         "default: libretrace_failing_io.so beside RETRACE, and without it they are left out")
    a = ap.parse_args()
    work = a.work or tempfile.mkdtemp(prefix="retrace-campaign-")
    os.makedirs(work, exist_ok=True)
    c = Campaign(os.path.abspath(a.retrace), work, random.Random(a.seed))
    try:
        parts = set(a.classes.split(","))
        if "damage" in parts:
            c.damage(smoke=a.smoke, quick=a.quick, only=a.only)
        smoke_kills = 2 if a.quick else 4
        if not a.only and "kills" in parts:
            c.kills(a.kills if a.kills is not None else (1000 if a.long else (smoke_kills if a.smoke else 50)))
        if not a.only and "hostile" in parts:
            c.hostile(smoke=a.quick)
        shim = a.shim or os.path.join(os.path.dirname(os.path.abspath(a.retrace)), "libretrace_failing_io.so")
        if not a.only and "async" in parts:
            if os.path.isfile(shim):
                trials = 2 if a.quick else (4 if a.smoke else (200 if a.long else 20))
                c.async_kills(trials, os.path.abspath(shim))
                c.async_disk_faults(trials, os.path.abspath(shim))
            else:
                print(f"campaign: no {shim}: the background-save trials are left out")
    finally:
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)
    k = c.counts
    print(f"campaign: trials {k['trials']}, detected {k['detected']}, accepted by design {k['accepted']}, "
          f"missed {k['missed']}, crashed {k['crashed']}, lost checkpoints {k['lost']}")
    for f in c.failures:
        print("  FAIL " + f)
    sys.exit(1 if c.failures else 0)


if __name__ == "__main__":
    main()
