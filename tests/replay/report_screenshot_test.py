"""The divergence report, rendered by headless Chromium at two sizes and checked pixel by pixel.

    .venv/bin/python tests/replay/report_screenshot_test.py RETRACE_BIN REPO_ROOT OUTPUT_DIR

Records the README's example (80 steps; run b flips one bit of layers.0.weight before step 57),
writes the report with `retrace bisect a b --html`, and screenshots it at 1280x1700 and 820x1500
into OUTPUT_DIR (kept for people to look at). In each screenshot, from the pixels alone:
  - the loss-difference chart's plot area is found by its background colour, and the steps map onto
    it with the data-x-min / data-x-max the page states;
  - the first-divergence line stands at the step `retrace diff --json` names;
  - the |loss a - loss b| curve lies on the zero line up to the last step whose losses are equal in
    `inspect --json`, and leaves it there;
  - the digest strip's red (differing) cells begin at the first step whose parameter digests differ.
The HTML itself must carry the bisect result (module, phase) and highlight differing fingerprint
fields (a second pair of runs under different BLAS thread counts).
"""

import json
import os
import re
import subprocess
import sys
import tempfile

from PIL import Image

FAILS = []
PLOT_FILL = (0xfd, 0xfb, 0xf3)   # the divergence charts' plot area (report_chart.cpp kDiffPlotFill)
ABS_DIFF = (0x6a, 0x3d, 0x9a)    # the absolute-difference series (kColorAbs)
DIFFERS = (0xe5, 0x48, 0x4d)     # a digest strip cell whose digests differ


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        FAILS.append(what)


def run(args, env=None):
    return subprocess.run(args, capture_output=True, text=True, env=env)


def reddish(c):
    """The divergence line's red, also where antialiasing blends it with the background."""
    return c[0] > c[1] + 60 and c[0] > c[2] + 50


def near(c, ref, tol):
    return sum((a - b) ** 2 for a, b in zip(c[:3], ref)) <= tol * tol


def plot_box(img):
    """The topmost region of PLOT_FILL pixels: (left, top, right, bottom), inclusive."""
    w, h = img.size
    px = img.load()
    rows = []
    for y in range(h):
        n = sum(1 for x in range(0, w, 2) if px[x, y][:3] == PLOT_FILL)
        rows.append(n)
    top = next(y for y in range(h) if rows[y] > 40)
    bottom = top
    gap = 0
    for y in range(top, h):  # grid lines cross the area: allow short gaps
        if rows[y] > 40:
            bottom, gap = y, 0
        else:
            gap += 1
            if gap > 4:
                break
    xs = [x for y in range(top, bottom + 1, 3) for x in range(w) if px[x, y][:3] == PLOT_FILL]
    return min(xs), top, max(xs), bottom


def columns_of(img, box, colour, tol, rows=None):
    left, top, right, bottom = box
    px = img.load()
    ys = rows if rows is not None else range(top, bottom + 1)
    match = colour if callable(colour) else (lambda c: near(c, colour, tol))
    return sorted({x for y in ys for x in range(left, right + 1) if match(px[x, y])})


def main():
    retrace, root, outdir = (os.path.abspath(a) for a in sys.argv[1:4])
    os.makedirs(outdir, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="report-test-")
    a, b = os.path.join(tmp, "a"), os.path.join(tmp, "b")
    base = [retrace, "record", "--plain", "--steps", "80", "--set", "checkpoint.every_steps=25"]
    check(run(base + ["--out", a]).returncode == 0, "record a")
    check(run(base + ["--out", b, "--inject", "perturb-param@57:layers.0.weight"]).returncode == 0, "record b")
    report = os.path.join(outdir, "perturb-at-57.html")
    bis = run([retrace, "bisect", a, b, "--html", report])
    check(bis.returncode == 1 and "step 57" in bis.stdout, f"bisect finds step 57: {bis.stdout.strip()[-300:]}")

    diff = json.loads(run([retrace, "diff", a + "/trace.rtrace", b + "/trace.rtrace", "--json"]).stdout)
    first = diff["steps"]["first_divergence"]["step"]
    ia = json.loads(run([retrace, "inspect", a + "/trace.rtrace", "--json"]).stdout)["steps"]
    ib = json.loads(run([retrace, "inspect", b + "/trace.rtrace", "--json"]).stdout)["steps"]
    loss_first = next(x["step"] for x, y in zip(ia, ib) if x["loss"] != y["loss"])
    param_first = next(x["step"] for x, y in zip(ia, ib) if x["param_digest"] != y["param_digest"])
    print(f"data: first divergence {first}, parameter digests differ from {param_first}, losses from {loss_first}")
    check(first == 57 and param_first == 57, "the data: run b parts at step 57")

    html = open(report).read()
    m = re.search(r'data-chart="loss-difference" data-x-min="(\d+)" data-x-max="(\d+)"', html)
    check(m is not None, "the page has a loss-difference chart with its step range")
    x_min, x_max = int(m.group(1)), int(m.group(2))
    check(f'class="divergence" data-step="{first}"' in html, "the page marks the first divergence")
    check("layers.0 (Linear)" in html and "<th>phase</th><td class=\"v\">state</td>" in html,
          "the page holds the bisect result (module and phase)")

    for size in ("1280,1700", "820,1500"):
        png = os.path.join(outdir, f"perturb-at-57-{size.replace(',', 'x')}.png")
        shot = run(["bash", os.path.join(root, "tools/diff_screenshot.sh"), report, png, size])
        check(shot.returncode == 0 and os.path.getsize(png) > 0, f"{size}: chromium screenshot {png} {shot.stderr}")
        if shot.returncode:
            continue
        img = Image.open(png).convert("RGB")
        box = plot_box(img)
        left, top, right, bottom = box
        width = right - left + 1

        def px_of(step):
            return left + (step - x_min) / (x_max - x_min) * width

        print(f"{size}: loss-difference plot area x {left}..{right}, y {top}..{bottom}")
        # The divergence line.
        cols = columns_of(img, box, reddish, 0, rows=range(top + (bottom - top) // 2, bottom))
        check(bool(cols) and abs(sum(cols) / len(cols) - px_of(first)) <= 3,
              f"{size}: divergence line at x {cols[:6]}, step {first} is x {px_of(first):.1f}")
        # The curve: on the zero line (the plot's bottom 6 %) up to step loss_first - 1, then above it.
        zero_band_top = bottom - int(0.09 * (bottom - top))
        above = columns_of(img, box, ABS_DIFF, 70, rows=range(top, zero_band_top))
        check(bool(above), f"{size}: the loss-difference curve leaves the zero line")
        if above:
            check(px_of(loss_first - 1) - 2 <= above[0] <= px_of(loss_first) + 2,
                  f"{size}: it leaves at x {above[0]}, between step {loss_first - 1} (x {px_of(loss_first - 1):.1f}) "
                  f"and step {loss_first} (x {px_of(loss_first):.1f}), where the losses first differ")
        on_zero = columns_of(img, box, ABS_DIFF, 70, rows=range(zero_band_top, bottom + 1))
        # (the dashed relative-difference line is drawn over it in places)
        before = [x for x in on_zero if x <= px_of(loss_first - 1)]
        check(bool(before) and before[0] <= px_of(x_min) + 10 and before[-1] >= px_of(loss_first - 1) - 3 and
              len(before) >= 0.5 * (px_of(loss_first - 1) - px_of(x_min)),
              f"{size}: before that the curve lies on the zero line, from x {before[:1]} to x {before[-1:]} "
              f"({len(before)} columns)")
        # The digest strip: the first red cell, below the charts.
        px = img.load()
        w, h = img.size
        reds = sorted({x for y in range(bottom, h) for x in range(w) if near(px[x, y], DIFFERS, 20)})
        step_w = width / (x_max - x_min + 1)
        check(bool(reds) and abs(reds[0] - (px_of(param_first) - step_w / 2)) <= step_w + 3,
              f"{size}: digest strip red from x {reds[:1]}, step {param_first} starts at "
              f"x {px_of(param_first) - step_w / 2:.1f}")

    # Fingerprints side by side: another torch thread count is a numerics field that differs (under
    # MKL, which runs on the torch threads, the BLAS count with it; and the elementwise lanes, an
    # information field, which go to 1 when torch runs two threads).
    c, d = os.path.join(tmp, "c"), os.path.join(tmp, "d")
    # Version 1's thread counts are numerics (under version 2, the default, they are information).
    short = [retrace, "record", "--plain", "--steps", "5", "--set", "runtime.numerics_version=1"]
    check(run(short + ["--out", c]).returncode == 0, "record c")
    check(run(short + ["--out", d, "--set", "runtime.threads=2"]).returncode == 0,
          "record d (runtime.threads=2)")
    fp_report = os.path.join(outdir, "threads.html")
    run([retrace, "diff", c + "/trace.rtrace", d + "/trace.rtrace", "--html", fp_report])
    fp = open(fp_report).read()
    table = fp[fp.index('<table class="fingerprints">'):]
    table = table[:table.index("</table>")]
    differing = re.findall(r'<tr class="differs"><td class="v">([^<]+)</td>', table)
    check("torch_threads" in differing
          and set(differing) <= {"torch_threads", "blas_threads", "info.elementwise_threads"},
          f"differing fingerprint fields highlighted: {differing}")
    check('<td class="v">blas_core</td>' in table and "<tr><td class=\"v\">blas_core</td>" in table,
          "equal fields are listed, not highlighted")
    run(["bash", os.path.join(root, "tools/diff_screenshot.sh"), fp_report, os.path.join(outdir, "threads.png")])

    if FAILS:
        print(f"{len(FAILS)} failures; screenshots in {outdir}")
        return 1
    print(f"report screenshots: OK ({outdir})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
