#!/usr/bin/env python3
"""Audit of every site that raises retrace::InvariantError (exit 70, "internal error").

Issue 38: no internal error may be reachable from file content (checkpoint shards, manifests,
traces, configs, token and data files, set-aside records). Every site that raises InvariantError
is listed in tools/audit/internal_errors.tsv with a kind:

  caller-contract  the condition depends only on values the program computed itself;
  checked-before   the value may come from a file, but a validation on every path to the site
                   refuses bad content first (the reason names it);
  REACHABLE        file content reaches the site unvalidated: a bug, this audit fails.

This script re-finds the sites (RETRACE_CHECK(cond, InvariantError, ...), RETRACE_FAIL(
InvariantError, ...) and `throw [::][retrace::]InvariantError(...)`, macro calls spanning any
number of lines, comments and string literals handled) in the C++ sources under src/,
tools/retrace/, replay/ and include/, and compares them with the TSV. A site's key is its file and
the first 40 characters of the first string literal of its message (tabs removed), with " #N"
appended when several sites of one file share that snippet. It fails (exit 1) for a site not in
the TSV, a TSV line no longer in the code, and a line whose kind is REACHABLE or unknown.

Issue 54: a standard-library exception escaping from parsing is an internal error too (std::stod
threw std::out_of_range for a subnormal number in a config). The parsers that throw on bad text,
the std::sto* family and std::ato*'s undefined behaviour alike, are not used under the same
roots: every such call is a problem, with core/parse_number.h's strict parsers to use instead.

Usage: python3 tools/audit/internal_errors.py REPO_ROOT [--list] [--plant]
  --list   print the sites found, tab-separated (file, line, function, site), and exit 0.
  --plant  audit a copy of the tree with a std::stod call planted in it, and exit 0 only when the
           audit catches it (the test that the audit can fail).

Standard library only.
"""

import os
import re
import sys
from collections import Counter, defaultdict

ROOTS = ("src", "tools/retrace", "replay", "include")
EXTENSIONS = (".cpp", ".h", ".hpp", ".cc")
TSV = os.path.join("tools", "audit", "internal_errors.tsv")
KINDS = ("caller-contract", "checked-before", "REACHABLE")
ALLOWED = ("caller-contract", "checked-before")
SNIPPET = 40

CONTROL = {"if", "for", "while", "switch", "catch", "else", "do", "try", "return", "case", "default"}
SCOPES = ("namespace", "class", "struct", "union", "enum", "extern")


def blank_comments(text):
    """Returns text with comments and preprocessor lines replaced by spaces (newlines kept, so
    offsets and line numbers are unchanged) and a parallel copy with string and char literal
    contents blanked too. String literals stay intact in the first."""
    out = list(text)
    code = list(text)
    i, n = 0, len(text)
    at_line_start = True
    while i < n:
        c = text[i]
        if c == "\n":
            at_line_start = True
            i += 1
            continue
        if at_line_start and c == "#":
            # A preprocessor directive, with its continuation lines.
            j = i
            while j < n:
                if text[j] == "\n" and text[j - 1] != "\\":
                    break
                j += 1
            for k in range(i, j):
                if text[k] != "\n":
                    out[k] = code[k] = " "
            i = j
            continue
        if not c.isspace():
            at_line_start = False
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            for k in range(i, j):
                out[k] = code[k] = " "
            i = j
            continue
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            for k in range(i, j):
                if text[k] != "\n":
                    out[k] = code[k] = " "
            i = j
            continue
        m = re.compile(r'R"([^()\\\s]{0,16})\(').match(text, i)
        if m and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = text.find(")" + m.group(1) + '"', m.end())
            end = n if end < 0 else end + len(m.group(1)) + 2
            for k in range(i + 1, end - 1):
                if text[k] != "\n":
                    code[k] = " "
            i = end
            continue
        if c == '"' or (c == "'" and not (i > 0 and text[i - 1].isalnum())):
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            for k in range(i + 1, min(j, n)):
                code[k] = " "
            i = j + 1
            continue
        i += 1
    return "".join(out), "".join(code)


def matching_paren(code, open_pos):
    """Index of the parenthesis closing the one at open_pos (code has literals blanked)."""
    depth = 0
    for k in range(open_pos, len(code)):
        if code[k] == "(":
            depth += 1
        elif code[k] == ")":
            depth -= 1
            if depth == 0:
                return k
    return len(code)


def split_args(code, start, end):
    """Top-level comma positions of the argument list code[start:end]."""
    parts, depth, last = [], 0, start
    for k in range(start, end):
        ch = code[k]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append((last, k))
            last = k + 1
    parts.append((last, end))
    return parts


def function_of_header(header):
    """The function name a brace opens, from the text between the statement start and '{';
    None for a block that is not a function body (control statement, lambda, initializer)."""
    h = header.strip()
    if not h:
        return None
    first = re.match(r"[A-Za-z_]\w*", h)
    if first and first.group(0) in CONTROL:
        return None
    if first and first.group(0) in SCOPES and "(" not in h:
        return None
    if re.search(r"(=|return|,|\(|\[)\s*$", h):
        return None  # brace initializer
    # A lambda: `[...] {`, `[...](...) [mutable] [-> T] {`.
    if re.search(r"\]\s*$", h):
        return None
    depth, k = 0, len(h) - 1
    tail = re.search(r"\)\s*(mutable|const|noexcept|override|final|\s|->\s*[\w:<>,\s*&]+)*$", h)
    if tail:
        k = tail.start()
        while k >= 0:
            if h[k] == ")":
                depth += 1
            elif h[k] == "(":
                depth -= 1
                if depth == 0:
                    break
            k -= 1
        if k > 0 and h[:k].rstrip().endswith("]"):
            return None
    # The name before the first top-level '(' (constructors with initializer lists included).
    depth = 0
    for k, ch in enumerate(h):
        if ch == "(" and depth == 0:
            before = h[:k].rstrip()
            m = re.search(r"((?:[A-Za-z_]\w*(?:<[^<>]*>)?::)*(?:~?[A-Za-z_]\w*|operator\s*\S+?))\s*$", before)
            if not m:
                return None
            name = re.sub(r"\s+", "", m.group(1))
            if name.split("::")[-1] in CONTROL:
                return None
            if name == "operator" or name.endswith("::operator"):
                name += "()"
            return name
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
    return None


def enclosing_functions(code):
    """For every offset, the name of the innermost function body that encloses it: a list of
    (open, close, name) spans."""
    spans = []
    stack = []  # (open offset, name or None)
    paren = [0]
    stmt_start = [0]
    for k, ch in enumerate(code):
        if ch == "(" or ch == "[":
            paren[-1] += 1
        elif ch == ")" or ch == "]":
            paren[-1] -= 1
        elif ch == "{":
            name = None
            if paren[-1] == 0:
                name = function_of_header(code[stmt_start[-1]:k])
            stack.append((k, name))
            paren.append(0)
            stmt_start.append(k + 1)
        elif ch == "}":
            if stack:
                open_pos, name = stack.pop()
                paren.pop()
                stmt_start.pop()
                if name:
                    spans.append((open_pos, k, name))
            if stmt_start:
                stmt_start[-1] = k + 1
        elif ch == ";" and paren[-1] == 0:
            stmt_start[-1] = k + 1
        elif ch == ":" and paren[-1] == 0:
            # `public:` and `case x:` end a header; `a::b` and ctor initializer lists do not.
            before = code[stmt_start[-1]:k].strip()
            if re.fullmatch(r"(public|private|protected|default|case\b.*)", before) and code[k + 1:k + 2] != ":":
                stmt_start[-1] = k + 1
    return spans


def first_literal(text, code, start, end):
    """The first string literal in text[start:end], without quotes, tabs removed, cut to SNIPPET."""
    k = start
    while k < end:
        if text[k] == '"' and code[k] == '"':
            j = k + 1
            while j < end and not (text[j] == '"' and code[j] == '"'):
                j += 1
            lit = text[k + 1:j].replace("\t", "")
            return lit[:SNIPPET]
        k += 1
    return ""


SITE_RE = re.compile(r"\b(RETRACE_CHECK|RETRACE_FAIL)\s*\(|\bthrow\s+(?:::)?(?:retrace::)?InvariantError\s*[({]")


STRAY_OK = re.compile(r"(class\s+InvariantError\b|catch\s*\(\s*(const\s+)?(::)?(retrace::)?InvariantError\b)")


def source_files(root):
    """(path relative to root, text) of every C++ source under ROOTS, in a stable order."""
    for top in ROOTS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames.sort()
            for fname in sorted(filenames):
                if fname.endswith(EXTENSIONS):
                    path = os.path.join(dirpath, fname)
                    with open(path, encoding="utf-8", errors="replace") as f:
                        yield os.path.relpath(path, root).replace(os.sep, "/"), f.read()


def find_sites(root, strays=None):
    """Every InvariantError site under ROOTS. Uses of the name that are neither a site, the class
    definition nor a catch clause (a wrapper macro, a stored exception) go to `strays`."""
    sites = []
    for rel, raw in source_files(root):
        text, code = blank_comments(raw)
        spans = None
        covered = []
        for m in SITE_RE.finditer(code):
            open_pos = m.end() - 1
            close = matching_paren(code, open_pos) if code[open_pos] == "(" else code.find("}", open_pos)
            args = split_args(code, open_pos + 1, close)
            if m.group(1) == "RETRACE_CHECK":
                if len(args) < 2 or code[args[1][0]:args[1][1]].strip() not in (
                        "InvariantError", "retrace::InvariantError", "::retrace::InvariantError"):
                    continue
                msg = (args[2][0], close) if len(args) > 2 else (close, close)
            elif m.group(1) == "RETRACE_FAIL":
                if code[args[0][0]:args[0][1]].strip() not in (
                        "InvariantError", "retrace::InvariantError", "::retrace::InvariantError"):
                    continue
                msg = (args[1][0], close) if len(args) > 1 else (close, close)
            else:
                msg = (open_pos + 1, close)
            covered.append((m.start(), close))
            if spans is None:
                spans = enclosing_functions(code)
            inner = [s for s in spans if s[0] < m.start() < s[1]]
            function = max(inner, key=lambda s: s[0])[2] if inner else "(file scope)"
            line = raw.count("\n", 0, m.start()) + 1
            snippet = first_literal(text, code, msg[0], msg[1])
            sites.append({"file": rel, "line": line, "function": function, "snippet": snippet})
        if strays is not None:
            for t in re.finditer(r"\bInvariantError\b", code):
                if any(a <= t.start() <= b for a, b in covered):
                    continue
                if STRAY_OK.search(code[max(0, t.start() - 40):t.end()]):
                    continue
                strays.append("%s:%d" % (rel, raw.count("\n", 0, t.start()) + 1))
            # Preprocessor lines are blanked above: a macro that wraps InvariantError.
            lines = raw.split("\n")
            k = 0
            while k < len(lines):
                first = k
                block = lines[k]
                while block.endswith("\\") and k + 1 < len(lines):
                    k += 1
                    block = block[:-1] + " " + lines[k]
                if re.match(r"\s*#\s*define\b", block) and re.search(
                        r"\bInvariantError\b", re.sub(r"/\*.*?\*/|//.*", "", block)):
                    strays.append("%s:%d" % (rel, first + 1))
                k += 1
    # Keys: file + snippet, with an occurrence index where one file repeats a snippet.
    counts = Counter((s["file"], s["snippet"]) for s in sites)
    seen = Counter()
    for s in sites:
        k = (s["file"], s["snippet"])
        seen[k] += 1
        s["site"] = s["snippet"] if counts[k] == 1 else "%s #%d" % (s["snippet"], seen[k])
    return sites


THROWING_PARSE_RE = re.compile(r"\b(?:std\s*::\s*)?(sto(?:i|l|ll|ul|ull|f|d|ld)|ato(?:i|l|ll|f))\s*\(")


def throwing_parses(root):
    """Calls of parsers that throw std::invalid_argument or std::out_of_range (or are undefined) on
    bad text, under ROOTS: "file:line: name"."""
    found = []
    for rel, raw in source_files(root):
        _, code = blank_comments(raw)
        for m in THROWING_PARSE_RE.finditer(code):
            before = code[max(0, m.start() - 1):m.start()]
            if before in (".", ">"):  # a member such as x.stod(...) is not the library's
                continue
            found.append("%s:%d: %s" % (rel, raw.count("\n", 0, m.start()) + 1, m.group(1)))
    return found


def read_tsv(path):
    rows, problems = [], []
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    header = lines[0].split("\t")
    want = ["file", "function", "site", "kind", "reason"]
    if header != want:
        problems.append("%s: header must be %s, is %s" % (TSV, "\\t".join(want), "\\t".join(header)))
        return rows, problems
    for n, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        cols = line.split("\t")
        if len(cols) != 5:
            problems.append("%s:%d: expected 5 tab-separated columns, got %d" % (TSV, n, len(cols)))
            continue
        rows.append(dict(zip(want, cols), tsv_line=n))
    return rows, problems


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip().split("\n\n")[-2], file=sys.stderr)
        return 2
    root = argv[1]
    if "--plant" in argv[2:]:
        import shutil
        import subprocess
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            for top in ROOTS + ("tools/audit",):
                if os.path.isdir(os.path.join(root, top)):
                    shutil.copytree(os.path.join(root, top), os.path.join(tmp, top))
            with open(os.path.join(tmp, "src", "planted.cpp"), "w") as f:
                f.write("#include <string>\ndouble planted(const std::string& s) { return std::stod(s); }\n")
            p = subprocess.run([sys.executable, os.path.abspath(__file__), tmp], capture_output=True, text=True)
        caught = p.returncode == 1 and "src/planted.cpp:2: stod" in p.stderr
        print("internal_errors --plant: %s" % ("caught the planted std::stod" if caught else
                                                 "MISSED the planted std::stod:\n" + p.stderr))
        return 0 if caught else 1
    strays = []
    sites = find_sites(root, strays)
    if "--list" in argv[2:]:
        for s in sites:
            print("\t".join([s["file"], str(s["line"]), s["function"], s["site"]]))
        return 0
    tsv_path = os.path.join(root, TSV)
    if not os.path.exists(tsv_path):
        print("internal_errors: %s is missing" % TSV, file=sys.stderr)
        return 1
    rows, problems = read_tsv(tsv_path)
    for where in strays:
        problems.append("%s: InvariantError used outside RETRACE_CHECK/RETRACE_FAIL/throw (a wrapper or another way "
                        "to raise it?); make this audit find it, then classify it" % where)
    for where in throwing_parses(root):
        problems.append("%s throws std::invalid_argument or std::out_of_range on bad text (an internal error, exit "
                        "70, when the text comes from a user or a file); parse with core/parse_number.h "
                        "(parse_decimal_u64, parse_u64_field, parse_finite_double) instead" % where)
    by_key = {(s["file"], s["site"]): s for s in sites}
    tsv_keys = Counter((r["file"], r["site"]) for r in rows)
    for key, c in tsv_keys.items():
        if c > 1:
            problems.append("duplicate TSV line for %s: \"%s\" (give repeated snippets an index \" #N\")" % key)
    notes = []
    for s in sites:
        if (s["file"], s["site"]) not in tsv_keys:
            problems.append("new internal-error site, classify it in %s: %s:%d in %s, site \"%s\""
                            % (TSV, s["file"], s["line"], s["function"], s["site"]))
    for r in rows:
        key = (r["file"], r["site"])
        s = by_key.get(key)
        if s is None:
            problems.append("stale line %d of %s, no such site in the code any more: %s \"%s\""
                            % (r["tsv_line"], TSV, r["file"], r["site"]))
            continue
        if r["kind"] not in KINDS:
            problems.append("%s:%d (%s): kind \"%s\" is not one of %s"
                            % (s["file"], s["line"], s["function"], r["kind"], ", ".join(KINDS)))
        elif r["kind"] not in ALLOWED:
            problems.append("%s:%d (%s): internal error REACHABLE from file content: %s"
                            % (s["file"], s["line"], s["function"], r["reason"]))
        if not r["reason"].strip():
            problems.append("%s:%d (%s): no reason given" % (s["file"], s["line"], s["function"]))
        if r["function"] != s["function"]:
            notes.append("note: %s \"%s\" is in %s now, the TSV says %s"
                         % (s["file"], s["site"], s["function"], r["function"]))
    for note in notes:
        print(note, file=sys.stderr)
    if problems:
        for p in problems:
            print("internal_errors: " + p, file=sys.stderr)
        print("internal_errors: FAILED, %d problem(s) over %d InvariantError sites" % (len(problems), len(sites)),
              file=sys.stderr)
        return 1
    kinds = Counter(r["kind"] for r in rows)
    print("internal_errors: ok, %d InvariantError sites: %s"
          % (len(sites), ", ".join("%d %s" % (kinds[k], k) for k in KINDS if kinds[k])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
