#!/usr/bin/env bash
# Builds the fuzzers with clang++ -fsanitize=fuzzer,address,undefined and runs each on a copy of
# its seed corpus (tools/fuzz/corpus/<name>/; new inputs stay in the copy): the checkpoint shard
# reader (the safetensors reader) and manifest parser, the trace file reader (frames, tail, chain),
# the record decoder, the llm.c token file header (token), the policy records of a checkpoint's
# metadata (policy: set-aside batches, fired faults, the guards' windows) and the config parser
# (TOML text and --set overrides; compiled with NDEBUG, as the build compiles it:
# toml++ 3.3.0 asserts on a table header with no key, "[\n", in a debug build, and reports it as a
# parse error in the release build).
#
#   tools/fuzz/run.sh [SECONDS]   run each fuzzer SECONDS seconds (default 60)
#   tools/fuzz/run.sh --smoke     CI mode: 10 s or 20000 runs per fuzzer (ctest: fuzz_smoke)
#   FUZZERS="trace record" tools/fuzz/run.sh 3600   only these
#
# Env: CXX (default clang++), FUZZ_BUILD_DIR (default /tmp/retrace-fuzz), FUZZ_JOBS (default 1).
# Exits non-zero if a fuzzer finds a crash; the crashing input is left in FUZZ_BUILD_DIR/artifacts.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cxx="${CXX:-clang++}"
out="${FUZZ_BUILD_DIR:-/tmp/retrace-fuzz}"
mkdir -p "$out/obj" "$out/artifacts"

if [[ "${1:-}" == "--smoke" ]]; then
  limits=(-max_total_time=10 -runs=20000)
else
  limits=(-max_total_time="${1:-60}")
fi

fuzzers=(${FUZZERS:-shard manifest trace record config token policy})
# The trace schema's generated code, as the build makes it.
mkdir -p "$out/gen/trace"
if [[ ! -f "$out/gen/trace/trace.capnp.c++" || "$repo/src/trace/trace.capnp" -nt "$out/gen/trace/trace.capnp.c++" ]]; then
  capnp compile -oc++:"$out/gen" --src-prefix="$repo/src" "$repo/src/trace/trace.capnp"
fi
# The frame layout's constants, generated from src/trace/frame_layout.json as the build does.
cmake -DFRAME_LAYOUT_JSON="$repo/src/trace/frame_layout.json" -DFRAME_LAYOUT_HEADER="$out/gen/trace/frame_layout.h" \
  -P "$repo/cmake/frame_layout.cmake"
sources=(src/core/digest.cpp src/core/hash_ahead.cpp src/core/file_util.cpp src/core/strict_json.cpp src/core/safetensors_writer.cpp
         src/core/safetensors_reader.cpp src/ckpt/schema.cpp src/ckpt/manifest.cpp
         src/trace/fd_io.cpp src/trace/frame_scanner.cpp src/trace/framing.cpp src/trace/record_codec.cpp
         src/records/records.cpp src/trace/trace_reader.cpp "$out/gen/trace/trace.capnp.c++"
         src/data/token_header.cpp src/train/guards.cpp src/train/policy_records.cpp)
flags=(-std=c++17 -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
       -I"$repo/src" -I"$repo/include" -I"$out/gen")

# Rebuild an object only when its source or a header changed since.
newest_header="$(find "$repo/include" "$repo/src/core" "$repo/src/records" "$repo/src/ckpt" "$repo/src/trace" "$repo/src/data/token_header.h" "$repo/src/train/guards.h" "$repo/src/train/policy_records.h" -name '*.h' -newer "$out/.built" 2>/dev/null | head -1 || true)"
objs=()
for src in "${sources[@]}"; do
  [[ $src == /* ]] || src="$repo/$src"
  obj="$out/obj/$(basename "$(dirname "$src")")_$(basename "$src").o"
  if [[ ! -f "$obj" || "$src" -nt "$obj" || -n "$newest_header" || ! -f "$out/.built" ]]; then
    echo "compiling ${src#$repo/}"
    "$cxx" "${flags[@]}" -fsanitize=fuzzer-no-link -c "$src" -o "$obj"
  fi
  objs+=("$obj")
done
# The config parser's own sources, for the config fuzzer only.
config_objs=()
newest_train_header="$(find "$repo/src/train" "$repo/src/model" "$repo/src/data" -name '*.h' -newer "$out/.built" 2>/dev/null | head -1 || true)"
for src in src/train/config_fields.cpp src/train/config_toml.cpp src/train/config_validate.cpp \
           src/train/config_reference.cpp src/train/faults.cpp; do
  obj="$out/obj/config_$(basename "$src").o"
  if [[ ! -f "$obj" || "$repo/$src" -nt "$obj" || -n "$newest_header" || -n "$newest_train_header" || ! -f "$out/.built" ]]; then
    echo "compiling $src"
    "$cxx" "${flags[@]}" -DNDEBUG -fsanitize=fuzzer-no-link -c "$repo/$src" -o "$obj"
  fi
  config_objs+=("$obj")
done
for fuzzer in "${fuzzers[@]}"; do
  bin="$out/${fuzzer}_fuzzer"
  extra=()
  [[ $fuzzer == config ]] && extra=("${config_objs[@]}")
  stale=""
  for o in ${extra[@]+"${extra[@]}"}; do [[ "$o" -nt "$bin" ]] && stale=1; done
  if [[ ! -f "$bin" || "$here/${fuzzer}_fuzzer.cpp" -nt "$bin" || -n "$newest_header" || -n "$stale" || ! -f "$out/.built" ]]; then
    echo "linking ${fuzzer}_fuzzer"
    "$cxx" "${flags[@]}" -fsanitize=fuzzer "$here/${fuzzer}_fuzzer.cpp" "${objs[@]}" ${extra[@]+"${extra[@]}"} -o "$bin" \
      -lcrypto -lxxhash -lcapnp -lkj -lzstd -pthread
  fi
done
touch "$out/.built"

# With -jobs libFuzzer writes fuzz-N.log into the current directory: keep those in $out.
cd "$out"
jobs_flag=()
if [[ "${FUZZ_JOBS:-1}" -gt 1 ]]; then jobs_flag=(-jobs="$FUZZ_JOBS" -workers="$FUZZ_JOBS"); fi

status=0
for fuzzer in "${fuzzers[@]}"; do
  work="$out/corpus-$fuzzer"
  mkdir -p "$work"
  cp -n "$here/corpus/$fuzzer/"* "$work/" 2>/dev/null || true
  echo "== ${fuzzer}_fuzzer ${limits[*]}"
  dict=(-dict="$here/json.dict")
  max_len=4096
  case $fuzzer in trace) dict=(); max_len=16384 ;; record | config | policy) dict=() ;; token) dict=(); max_len=8192 ;; esac
  if ! "$out/${fuzzer}_fuzzer" "${limits[@]}" ${dict[@]+"${dict[@]}"} -max_len=$max_len -rss_limit_mb=1024 ${jobs_flag[@]+"${jobs_flag[@]}"} \
       -artifact_prefix="$out/artifacts/${fuzzer}-" -print_final_stats=1 "$work" 2>&1 | tail -n 25; then
    status=1
  fi
done
exit $status
