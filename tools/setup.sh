#!/usr/bin/env bash
# Installs what retrace needs on Debian 12, as root. Skips apt entirely when everything is there.
#   tools/setup.sh            Debian's packages (LibTorch 1.13, CPU) and the test environment .venv
#   tools/setup.sh --torch2   also .venv-torch: the pinned PyPI torch wheel (LibTorch 2.x with CUDA
#                             and NCCL, and torchrun), about 4.6 GB
set -euo pipefail
torch2=0
for arg in "$@"; do
  case "$arg" in
    --torch2) torch2=1 ;;
    *) echo "setup: unknown option $arg (try --torch2)" >&2; exit 2 ;;
  esac
done
packages=(
  build-essential cmake pkg-config ccache
  libtorch-dev                 # LibTorch 1.13 (CPU): the tensor library we train with
  libgloo-dev                  # Gloo headers: c10d's CPU process group for data parallelism
  libopenblas0-pthread         # an optimized BLAS; Debian's libtorch uses whatever libblas.so.3 is
  libblis4-pthread libblis-pthread-dev  # BLIS 0.9: portable numerics version 2's GEMMs, the same bits at any thread count (loaded by retrace itself, never as libblas.so.3)
  libtcmalloc-minimal4         # tcmalloc for the retrace binary (fewer page faults than glibc malloc)
  libcapnp-dev capnproto       # Cap'n Proto: the trace's record schema, compiled at build time
  libzstd-dev                  # zstd: trace frame compression
  libxxhash-dev                # xxh3-128: per-step digests and the hash chain
  libssl-dev                   # OpenSSL: sha256 of checkpoint shards and data files
  zlib1g-dev                   # zlib: reading the gzip-compressed IDX data files
  libcli11-dev                 # CLI11: the command line
  libtomlplusplus-dev          # toml++: run configs
  nlohmann-json3-dev           # nlohmann-json: manifests, safetensors headers, --json output
  libgtest-dev                 # GoogleTest: unit tests
  librapidcheck-dev            # RapidCheck: property-based tests
  dataset-fashion-mnist        # the built-in default data set
  libprotobuf-dev protobuf-compiler  # protobuf: TensorBoard event records (`export --tensorboard`)
  libboost-dev                 # Boost.CRC: the CRC32C of TensorBoard's record framing
  python3-venv                 # the test environment .venv (Python peers that read retrace's output)
  python3-dev                  # Python.h: the Python package's compiled module (python/src)
  chromium                     # headless Chromium: the diff report's screenshot test
  iproute2                     # ip netns and veth: the two-host test's network namespaces
  clang-format-14              # the tree's format (.clang-format), checked by the clang_format test
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
# Debian's libtorch links libblas.so.3: make sure it is OpenBLAS, not the reference BLAS (16x slower).
if update-alternatives --query libblas.so.3-x86_64-linux-gnu >/dev/null 2>&1; then
  update-alternatives --set libblas.so.3-x86_64-linux-gnu \
    /usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 >/dev/null 2>&1 || true
fi
# A virtual environment made with Debian's Python from a pinned requirements file, remade when
# the file changes (a copy of it inside marks what is installed).
make_venv() {  # directory, requirements file, what it is for
  if ! cmp -s "$2" "$1/$(basename "$2")" 2>/dev/null; then
    echo "setup: installing $3 into $1"
    /usr/bin/python3 -m venv "$1"
    "$1/bin/pip" install -q --disable-pip-version-check -r "$2"
    cp "$2" "$1/$(basename "$2")"
  fi
}
root=$(cd "$(dirname "$0")/.." && pwd)
# The test environment: the Python peers the tests read retrace's output with (pinned in
# tools/requirements-test.txt), in .venv at the repository root.
make_venv "$root/.venv" "$root/tools/requirements-test.txt" "the test environment"
# LibTorch 2.x: the pinned PyPI torch wheel in .venv-torch (tools/requirements-torch2.txt). CMake
# takes it with -DRETRACE_TORCH_ROOT="$(tools/torch-root)"; the CUDA toolkit it compiles against
# is /usr/local/cuda.
if ((torch2)); then
  make_venv "$root/.venv-torch" "$root/tools/requirements-torch2.txt" "LibTorch 2.x (PyPI torch)"
fi
echo "setup: ok"
