#!/usr/bin/env bash
# The GPU check: run from the repository root on the GPU machine (one H200; PyTorch 2.11 with CUDA
# 13.0 in its Python, nvcc, CMake and ninja; no package registry), with .gpu-deps/deps.tar.gz
# carried (made here by tools/gpu/pack.sh). It builds retrace against that Python's own LibTorch
# with CUDA and NCCL, runs the `gpu` tests and the CUDA demos, and writes a report:
#   - two CUDA runs of the MLP, and of the GPT, give equal traces (bitwise);
#   - interrupt and resume on CUDA: RESUME VERIFIED;
#   - the CUDA Philox state round trip, activation-checkpoint recompute RNG and NCCL at world
#     size 1 (gpu_test), and a GPT with checkpoint = "full" equal to one without;
#   - ZeRO stage 1 on the device equals stage 0 (digest version 3's sums taken on the GPU);
#   - the FP16 skip-and-scale demo (amp.mode = fp16 with the scaler, injected NaN and Inf);
#   - steps per second of the GPT on CUDA, a figure.
#
#   tools/gpu/check.sh [--rehearse] [--python PY] [--jobs N]
#
# --rehearse runs everything but what needs a GPU (here, against the PyPI wheel of .venv-torch):
# the same build, the gpu tests (which then skip), and each demo on the CPU instead.
# The report is $OUT/gpu-report.md (or ./gpu-report.md), the logs beside it in gpu-logs/.
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
rehearse=0 py=python3 jobs=$(nproc)
while (($#)); do
  case "$1" in
    --rehearse) rehearse=1 ;;
    --python) py=$2; shift ;;
    --jobs) jobs=$2; shift ;;
    *) echo "check: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
outdir=${OUT:-$root}
report="$outdir/gpu-report.md"
logs="$outdir/gpu-logs"
mkdir -p "$logs"
t_start=$(date +%s)
fails=0
: > "$report"
say() { echo "$*" | tee -a "$report"; }
result() {  # name, status (0 pass), detail
  if [[ $2 -eq 0 ]]; then say "- PASS $1${3:+: $3}"; else say "- FAIL $1${3:+: $3}"; fails=$((fails + 1)); fi
}

say "# retrace GPU check ($( ((rehearse)) && echo "rehearsal, no GPU" || echo "GPU run"), $(date -u +%Y-%m-%dT%H:%M:%SZ))"
say ""
say "## Machine"
say '```'
(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || echo "nvidia-smi: none") | tee -a "$report"
"$py" -c 'import torch, os; print("torch", torch.__version__, "CUDA", torch.version.cuda, "cuDNN", torch.backends.cudnn.version(), "NCCL", ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else "-", "devices", torch.cuda.device_count())' 2>&1 | tail -1 | tee -a "$report"
(nvcc --version | tail -2 | head -1; cmake --version | head -1; ninja --version; echo "cores $(nproc)") 2>&1 | tee -a "$report"
say '```'

# ---- the dependencies carried from Debian ------------------------------------------------------
deps="$root/.gpu-deps"
if [[ ! -d "$deps/usr" ]]; then
  [[ -f "$deps/deps.tar.gz" ]] || { say "no $deps/deps.tar.gz: run tools/gpu/pack.sh where Debian's packages are, and carry .gpu-deps"; exit 2; }
  tar -C "$deps" -xzf "$deps/deps.tar.gz"
fi
d="$deps/usr"
lib="$d/lib/x86_64-linux-gnu"
for pc in "$lib"/pkgconfig/*.pc "$d"/share/pkgconfig/*.pc; do
  [[ -f "$pc" ]] && sed -i "s|^prefix=/usr\$|prefix=$d|" "$pc"
done
export PKG_CONFIG_PATH="$lib/pkgconfig:$d/share/pkgconfig"
export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$d/bin:$PATH"
# Portable numerics version 2 opens BLIS by its Debian path; here it lies in the unpacked packages.
export RETRACE_BLIS_LIBRARY="$lib/blis-pthread/libblis.so.4"
torch_root=$("$py" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
cuda_root=$(dirname "$(dirname "$(command -v nvcc)")")

# ---- build ------------------------------------------------------------------------------------
say ""
say "## Build (LibTorch from $torch_root, CUDA toolkit $cuda_root, $jobs jobs)"
gen=()
command -v ninja > /dev/null && gen=(-G Ninja)
b="$root/build-gpu"
t0=$(date +%s)
cmake "${gen[@]}" -S . -B "$b" -DCMAKE_BUILD_TYPE=Release -DRETRACE_TORCH_ROOT="$torch_root" \
  -DCUDAToolkit_ROOT="$cuda_root" -DCMAKE_PREFIX_PATH="$d" -DCMAKE_LIBRARY_PATH="$lib" \
  -DProtobuf_PROTOC_EXECUTABLE="$d/bin/protoc" -DBoost_INCLUDE_DIR="$d/include" \
  -DOPENSSL_ROOT_DIR="$d" -DZLIB_ROOT="$d" -DBLIS_INCLUDE_DIR="$d/include/x86_64-linux-gnu/blis-pthread" \
  > "$logs/configure.log" 2>&1
rc=$?
grep -E "retrace builds against|CUDA detected" "$logs/configure.log" | tee -a "$report"
if [[ $rc -eq 0 ]]; then
  cmake --build "$b" -j "$jobs" --target retrace gpu_test > "$logs/build.log" 2>&1
  rc=$?
fi
result "build (retrace, gpu_test)" $rc "$(( $(date +%s) - t0 )) s; logs in gpu-logs/configure.log, build.log"
if [[ $rc -ne 0 ]]; then
  say '```'; tail -25 "$logs/build.log" "$logs/configure.log" 2> /dev/null | tee -a "$report"; say '```'
  exit 1
fi
bin="$b/retrace"
grep -E "^(RETRACE_WITH_NCCL|CAFFE2_USE_CUDA)" "$b/CMakeCache.txt" | tee -a "$report"

# ---- gpu tests --------------------------------------------------------------------------------
say ""
say "## gpu tests"
"$b/gpu_test" > "$logs/gpu_test.log" 2>&1
rc=$?
grep -E "^\[  (PASSED|FAILED|SKIPPED) |^GPU:|Skipped|no CUDA" "$logs/gpu_test.log" | sort -u | tee -a "$report"
if ((rehearse)); then
  grep -q "SKIPPED" "$logs/gpu_test.log"
  result "gpu_test skips without a GPU" $? "each with its reason"
else
  ! grep -q "SKIPPED\|FAILED" "$logs/gpu_test.log" && [[ $rc -eq 0 ]]
  result "gpu_test (Philox round trip, checkpoint recompute RNG, NCCL world size 1, device fields)" $?
fi

# ---- demos ------------------------------------------------------------------------------------
dev=cuda
((rehearse)) && dev=cpu
say ""
say "## Demos on runtime.device = $dev"
w="$outdir/gpu-runs"
rm -rf "$w"
mkdir -p "$w"
fm=(--set data.dir="$d/share/datasets/fashion-mnist" --set runtime.device=$dev --plain)
gpt=(--config configs/char-gpt.toml --set data.dir="$d/share/common-licenses" --set runtime.device=$dev --plain)
same() { python3 "$root/tests/run/same_trace.py" "$bin" "$1/trace.rtrace" "$2/trace.rtrace" > "$3" 2>&1; }

"$bin" record "${fm[@]}" --steps 200 --out "$w/mlp1" > "$logs/mlp1.log" 2>&1 &&
  "$bin" record "${fm[@]}" --steps 200 --out "$w/mlp2" > "$logs/mlp2.log" 2>&1 && same "$w/mlp1" "$w/mlp2" "$logs/mlp-same.log"
result "MLP: two runs, equal traces (200 steps)" $? "$(tail -1 "$logs/mlp-same.log" 2> /dev/null)"

"$bin" record "${gpt[@]}" --steps 40 --out "$w/gpt1" > "$logs/gpt1.log" 2>&1 &&
  "$bin" record "${gpt[@]}" --steps 40 --out "$w/gpt2" > "$logs/gpt2.log" 2>&1 && same "$w/gpt1" "$w/gpt2" "$logs/gpt-same.log"
result "GPT: two runs, equal traces (40 steps)" $? "$(tail -1 "$logs/gpt-same.log" 2> /dev/null)"

"$bin" record "${gpt[@]}" --steps 40 --set model.checkpoint=full --out "$w/gpt-ckpt" > "$logs/gpt-ckpt.log" 2>&1 &&
  same "$w/gpt1" "$w/gpt-ckpt" "$logs/gpt-ckpt-same.log"
result "GPT with activation checkpointing (full) equals it without (dropout 0.1)" $? "$(tail -1 "$logs/gpt-ckpt-same.log" 2> /dev/null)"

# ZeRO's views of the parameters on the device and trace.digest_version 3's sums taken there: the
# same trace as the replicated optimizer's with the same digests.
v3=(--set trace.digest_version=3 --steps 40)
"$bin" record "${gpt[@]}" "${v3[@]}" --out "$w/gpt-v3" > "$logs/gpt-v3.log" 2>&1 &&
  "$bin" record "${gpt[@]}" "${v3[@]}" --set runtime.zero_stage=1 --out "$w/gpt-zero" > "$logs/gpt-zero.log" 2>&1 &&
  same "$w/gpt-v3" "$w/gpt-zero" "$logs/gpt-zero-same.log"
result "GPT under runtime.zero_stage = 1 equals stage 0 (digest version 3 on the device, 40 steps)" $? "$(tail -1 "$logs/gpt-zero-same.log" 2> /dev/null)"

"$bin" record "${fm[@]}" --total-steps 60 --interrupt-at 30 --verify-resume --out "$w/resume" > "$logs/resume.log" 2>&1
rc=$?
grep -E "RESUME (VERIFIED|FAILED|NOT)" "$logs/resume.log" | head -2 | tee -a "$report"
result "interrupt at 30 of 60, resume: verified" $rc

amp=(--set amp.mode=fp16 --set amp.scaler=on)
((rehearse)) && amp=(--set amp.mode=bf16 --set amp.scaler=on)
"$bin" record "${fm[@]}" --steps 20 --inject nan-loss@5,inf-grad@9 "${amp[@]}" --out "$w/amp" > "$logs/amp.log" 2>&1
rc=$?
say '```'
grep -E "step +(4|5|6|9|10) " "$logs/amp.log" | head -6 | tee -a "$report"
say '```'
[[ $rc -eq 0 ]] && [[ $(grep -c "SKIP" "$logs/amp.log") -ge 2 ]]
result "${amp[*]}: the injected NaN and Inf steps are SKIPs with their reasons (the scale column shows the scaler)" $?

"$bin" inspect "$w/gpt1/trace.rtrace" --json > "$logs/gpt1.json" 2>&1
python3 - "$logs/gpt1.json" << 'PY' | tee -a "$report"
import json, statistics, sys
steps = json.load(open(sys.argv[1]))["steps"][5:]
ms = [s["timings"]["step_ms"] if "step_ms" in s["timings"] else sum(v for v in s["timings"].values() if isinstance(v, (int, float))) for s in steps]
med = statistics.median(ms)
print(f"- GPT step (batch 16 x 128 tokens, 8 layers of 128): median {med:.1f} ms over {len(ms)} steps, {1000 / med:.1f} steps/s")
PY

say ""
say "## Summary"
say "$fails failed; $(( $(date +%s) - t_start )) s in all"
exit $((fails > 0))
