#!/usr/bin/env python3
"""Whole-trace equality of two runs, as the edge tests require it of an interrupted-and-resumed run
and the uninterrupted one: every step record in order (rollback re-runs included; every field and
digest but the timings), every evaluation, and every training event (process events, which say that
a process resumed, crashed or left a checkpoint file, are left out).

  same_trace.py RETRACE A/trace.rtrace B/trace.rtrace

Exit 0 and "same" when equal; exit 1 and the first difference otherwise.
"""
import json
import subprocess
import sys

PROCESS_EVENTS = {"resume", "crash", "checkpoint"}


def load(retrace, path):
    out = subprocess.run([retrace, "inspect", path, "--json"], check=True, capture_output=True, text=True).stdout
    j = json.loads(out)
    steps = [{k: v for k, v in s.items() if k != "timings"} for s in j["steps"]]
    events = [e for e in j["events"] if e["kind"] not in PROCESS_EVENTS]
    return steps, j["evals"], events


def first_difference(a, b, what):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            keys = [k for k in x if x.get(k) != y.get(k)] if isinstance(x, dict) else []
            return f"{what} {i + 1}: fields {keys}: {x} vs {y}"
    if len(a) != len(b):
        return f"{len(a)} {what}s in the first, {len(b)} in the second"
    return None


def main():
    retrace, pa, pb = sys.argv[1:4]
    a, b = load(retrace, pa), load(retrace, pb)
    for what, x, y in (("step record", a[0], b[0]), ("evaluation", a[1], b[1]), ("training event", a[2], b[2])):
        d = first_difference(x, y, what)
        if d:
            print("differ:", d)
            return 1
    print(f"same: {len(a[0])} step records, {len(a[1])} evaluations, {len(a[2])} training events")
    return 0


if __name__ == "__main__":
    sys.exit(main())
