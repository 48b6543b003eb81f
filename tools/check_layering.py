#!/usr/bin/env python3
"""The parts of retrace depend one way (docs/development.md, "Layout of the code"; each part's README.md); this checks every include.

Each folder below is one part. A file of a part may include headers of the parts listed for it,
and of its own part; anything else in quotes is a wrong-way include and fails the check. The public
headers (include/retrace/) may include only each other and system headers: users compile them
without retrace's internals. retrace/error.h, the one error hierarchy, is public and below every part.

    tools/check_layering.py [ROOT]            check the tree at ROOT (default: this repository)
    tools/check_layering.py --plant ROOT      copy ROOT to a temporary directory, add one wrong-way
                                              include (train -> run) and show that the check fails

Exit status: 0 clean, 1 wrong-way includes found (each printed as FILE:LINE: PART includes PART).
"""
import os
import re
import shutil
import sys
import tempfile

# part -> the parts it may include (besides itself), in the order of DESIGN's arrow.
BELOW = {
    "core": [],
    "kernels": ["core"],  # torch-free numerical kernels (BLIS's GEMM)
    "records": ["core"],
    "rng": ["core", "records"],
    "data": ["core", "records", "rng"],
    "model": ["core", "kernels", "records", "rng"],
    "train": ["core", "kernels", "records", "rng", "data", "model"],
    "trace": ["core", "records"],
    "ckpt": ["core", "records", "rng", "data", "model", "train"],
    "distributed": ["core", "records", "train"],
    "run": ["core", "records", "rng", "data", "model", "train", "trace", "ckpt", "distributed"],
    "replay": ["core", "records", "rng", "data", "model", "train", "trace", "ckpt", "distributed", "run"],
    "api": ["core", "records", "rng", "data", "model", "train", "trace", "ckpt", "distributed", "run", "replay",
            "retrace"],
    "cli": ["core", "records", "rng", "data", "model", "train", "trace", "ckpt", "distributed", "run", "replay",
            "api", "retrace"],
    "retrace": [],  # include/retrace: the public API
    "python": ["retrace"],  # python/src: the Python package's module, over the public API only
}

# Where each part's files are (relative to the root).
FOLDERS = {
    **{p: os.path.join("src", p) for p in
       ["core", "kernels", "records", "rng", "data", "model", "train", "trace", "ckpt", "distributed", "run", "api"]},
    "replay": "replay",
    "cli": os.path.join("tools", "retrace"),
    "retrace": os.path.join("include", "retrace"),
    "python": os.path.join("python", "src"),
}

INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')


def part_of_include(path, own_folder):
    """The part a quoted include names, or None for a header next to the file (no folder)."""
    head = path.split("/", 1)[0]
    if "/" not in path:
        return None if os.path.exists(os.path.join(own_folder, path)) else "?"
    if head == "retrace":
        return "retrace"
    return head if head in BELOW else "?"


def check(root):
    problems = []
    for part, folder in FOLDERS.items():
        full = os.path.join(root, folder)
        if not os.path.isdir(full):
            continue
        allowed = set(BELOW[part]) | {part}
        for dirpath, _, files in os.walk(full):
            for name in sorted(files):
                if not name.endswith((".h", ".cpp", ".hpp")):
                    continue
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8", errors="replace") as f:
                    for lineno, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        if m.group(1) == "retrace/error.h":
                            continue  # the error hierarchy is public and below everything
                        target = part_of_include(m.group(1), dirpath)
                        if target is None:
                            continue
                        if target == "?":
                            # Generated headers (trace/trace.capnp.h) carry their part's prefix; a
                            # quoted include outside every part is the CLI's own files.
                            continue
                        if target not in allowed:
                            rel = os.path.relpath(path, root)
                            problems.append(f"{rel}:{lineno}: {part} includes {target} "
                                            f"(\"{m.group(1)}\"); {part} may include only "
                                            f"{', '.join(BELOW[part]) or 'nothing else'}")
    return problems


def main(argv):
    if len(argv) >= 2 and argv[1] == "--plant":
        src = argv[2] if len(argv) > 2 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        with tempfile.TemporaryDirectory() as tmp:
            for folder in FOLDERS.values():
                if os.path.isdir(os.path.join(src, folder)):
                    shutil.copytree(os.path.join(src, folder), os.path.join(tmp, folder))
            victim = os.path.join(tmp, "src", "train", "step.cpp")
            with open(victim, encoding="utf-8") as f:
                text = f.read()
            with open(victim, "w", encoding="utf-8") as f:
                f.write('#include "run/run.h"  // planted: a wrong-way include\n' + text)
            problems = check(tmp)
            for p in problems:
                print(p)
            planted = [p for p in problems if p.startswith(os.path.join("src", "train", "step.cpp") + ":1:")]
            if len(planted) != 1:
                print("layering check MISSED the planted include", file=sys.stderr)
                return 1
            print(f"the planted wrong-way include was caught ({len(problems)} problem(s) in the copy)")
            return 0
    root = argv[1] if len(argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    problems = check(root)
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} wrong-way include(s): move the code to the part that owns it, or pass "
              "what it needs in from above", file=sys.stderr)
        return 1
    print("layering: every include points down")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
