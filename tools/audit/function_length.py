#!/usr/bin/env python3
"""Function lengths of retrace's production code (issue 53: no function over 80 lines without a reason).

Counts every function in the C++ files under src/, replay/, tools/retrace/, include/ and
python/src/: comments, string literals and preprocessor lines are blanked first; a brace body
opened at namespace or class scope whose head ends in `)` (or const, noexcept, override, a
trailing return type) is a function, from the first line of its head to its closing brace;
lambdas count toward the function that holds them; a macro body such as PYBIND11_MODULE counts.

tools/audit/function_length.allow lists the functions allowed over the limit, one per line:
`file<TAB>function<TAB>reason`. The audit fails (exit 1) for a function over the limit that the
list does not name, and for a line of the list that no longer names one (split it: delete the line).

Usage: python3 tools/audit/function_length.py REPO_ROOT [--over N] [--list] [--plant]
  --list    print every function over N lines (default 60), longest first, and exit 0
  --plant   audit a copy of the tree with an 81-line function planted in it, and exit 0 only when
            the audit catches it (the test that the audit can fail)
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

LIMIT = 80
ROOTS = ("src", "replay", "tools/retrace", "include", "python/src")
SIG = re.compile(r"\)\s*(const|noexcept|override|final|mutable|&|&&|\s|->\s*[\w:<>,\s*&]+)*$")


def blank(text):
    """Comments, literals and preprocessor lines to spaces, newlines kept."""
    spaces = lambda m: re.sub(r"[^\n]", " ", m.group(0))
    text = re.sub(r'//[^\n]*|/\*.*?\*/|R"(\w*)\(.*?\)\1"|"(?:\\.|[^"\\\n])*"|(?<![\w])\'(?:\\.|[^\'\\\n])*\'',
                  spaces, text, flags=re.S)
    return re.sub(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", spaces, text, flags=re.M)


def functions(path):
    """(lines, first line, last line, name) of every function in a file."""
    stack, head, start, line, out = [], "", None, 1, []
    with open(path, errors="replace") as f:
        text = blank(f.read())
    for c in text:
        line += c == "\n"
        if any(k == "func" for k, *_ in stack):
            if c == "{":
                stack.append(("block",))
            elif c == "}":
                kind, *rest = stack.pop()
                if kind == "func":
                    out.append((line - rest[0] + 1, rest[0], line, rest[1]))
        elif c == "{":
            h = " ".join(head.split())
            name = h.split("(")[0]
            if (re.match(r"(template\s*<.*>\s*)?(class|struct|union)\b", h) and "(" not in h.split(":")[0]
                    or h == "" or h.startswith(("namespace", "extern"))):
                stack.append(("scope",))
                head, start = "", None
            elif (SIG.search(h) and not re.match(r"(if|for|while|switch|return)\b", h)
                  and "=" not in re.sub(r"operator\s*[^\s(]*", "", name)):
                fn = re.sub(r".*?([\w:~]+|operator\W+)\s*$", r"\1", name)
                stack.append(("func", start, fn))
                head, start = "", None
            else:  # an initializer's braces: the head goes on
                stack.append(("init",))
                head += c
        elif c == "}":
            if (stack.pop()[0] if stack else "scope") == "init":
                head += c
            else:
                head, start = "", None
        elif c == ";" and not (stack and stack[-1][0] == "init"):
            head, start = "", None
        else:
            if start is None and not c.isspace():
                start = line
            if start is not None:
                head += c
            if head.strip() in ("public:", "private:", "protected:"):
                head, start = "", None
    return out


def source_files(root):
    files = []
    for r in ROOTS:
        for d, _, names in os.walk(os.path.join(root, r)):
            files += [os.path.join(d, n) for n in names if n.endswith((".h", ".cpp"))]
    return sorted(files)


def measure(root, over):
    found = []
    for path in source_files(root):
        rel = os.path.relpath(path, root)
        for n, first, last, name in functions(path):
            if n > over:
                found.append((n, rel, first, last, name))
    return sorted(found, key=lambda f: (-f[0], f[1], f[2]))


def read_allow(root):
    allow = {}
    with open(os.path.join(root, "tools/audit/function_length.allow")) as f:
        for number, line in enumerate(f, 1):
            if not line.strip() or line.startswith("#"):
                continue
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 3 or not parts[2].strip():
                sys.exit(f"function_length.allow:{number}: want file<TAB>function<TAB>reason, got {line!r}")
            allow[(parts[0], parts[1])] = parts[2]
    return allow


def audit(root):
    long = measure(root, LIMIT)
    allow = read_allow(root)
    seen, problems = set(), []
    for n, rel, first, last, name in long:
        if (rel, name) in allow:
            seen.add((rel, name))
        else:
            problems.append(f"{rel}:{first}: {name} is {n} lines (limit {LIMIT}): split it, or say why it "
                            f"may not be split in tools/audit/function_length.allow")
    for key in sorted(set(allow) - seen):
        problems.append(f"function_length.allow names {key[0]} {key[1]}, which is no longer over {LIMIT} "
                        f"lines: delete its line")
    for p in problems:
        print(p)
    print(f"{len(long)} functions over {LIMIT} lines, {len(seen)} of them allowed; {len(problems)} problems")
    return 1 if problems else 0


def plant(root):
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "tree")
        for r in ROOTS + ("tools/audit",):
            if os.path.isdir(os.path.join(root, r)):
                shutil.copytree(os.path.join(root, r), os.path.join(copy, r))
        with open(os.path.join(copy, "src", "planted_long_function.cpp"), "w") as f:
            f.write("int planted(int x) {\n" + "  x += 1;\n" * 80 + "  return x;\n}\n")
        r = subprocess.run([sys.executable, __file__, copy], capture_output=True, text=True)
        caught = r.returncode == 1 and "planted" in r.stdout
        print(("caught: " if caught else "NOT caught: ") + r.stdout.strip().splitlines()[0] if r.stdout else "no output")
        return 0 if caught else 1


def main():
    args = sys.argv[1:]
    if not args:
        sys.exit(__doc__)
    root = args[0]
    over = int(args[args.index("--over") + 1]) if "--over" in args else 60
    if "--list" in args:
        for n, rel, first, last, name in measure(root, over):
            print(f"{n}\t{rel}:{first}-{last}\t{name}")
        return 0
    if "--plant" in args:
        return plant(root)
    return audit(root)


if __name__ == "__main__":
    sys.exit(main())
