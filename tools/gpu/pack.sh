#!/usr/bin/env bash
# Run here (Debian 12 with its package registry): packs what tools/gpu/check.sh needs on the GPU
# machine, which has PyTorch 2.11 with CUDA 13.0, nvcc, CMake and ninja but no package registry:
# the Debian packages of retrace's other dependencies, downloaded (apt-get download) and unpacked
# (dpkg -x), pruned to headers, shared libraries, CMake and pkg-config files and the two schema
# compilers, into .gpu-deps/deps.tar.gz (git-ignored; carried with `run`, at most 64 MiB).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out="$root/.gpu-deps"
packages=(
  libcapnp-dev libcapnp-0.9.2 capnproto      # the trace schema and its compiler
  libzstd-dev libzstd1 libxxhash-dev libxxhash0 libssl-dev libssl3 zlib1g-dev zlib1g
  libcli11-dev libtomlplusplus-dev libtomlplusplus3 nlohmann-json3-dev
  libprotobuf-dev libprotobuf32 libprotobuf-lite32 protobuf-compiler libprotoc32
  libgtest-dev librapidcheck-dev
  libboost1.74-dev                           # only the headers Boost.CRC needs are kept
  dataset-fashion-mnist                      # the built-in default data set
  libblis4-pthread libblis-pthread-dev       # portable numerics version 2's GEMMs (kernels/gemm.h)
)
rm -rf "$out/stage" "$out/debs"
mkdir -p "$out/debs" "$out/stage"
(cd "$out/debs" && apt-get download -q "${packages[@]}" > /dev/null)
for d in "$out"/debs/*.deb; do dpkg -x "$d" "$out/stage"; done
s="$out/stage/usr"
# Boost: the closure of <boost/crc.hpp>, the one Boost header retrace uses.
mkdir -p "$out/boost-all"
mv "$s/include/boost" "$out/boost-all/boost"
mkdir -p "$s/include/boost"
g++ -std=c++17 -M -x c++ -I "$out/boost-all" - <<< $'#include <boost/crc.hpp>\n#include <boost/version.hpp>' \
  | tr ' \\' '\n\n' | grep "boost-all/boost/" | sed "s|.*boost-all/boost/||" | sort -u | while read -r h; do
    mkdir -p "$s/include/boost/$(dirname "$h")"
    cp "$out/boost-all/boost/$h" "$s/include/boost/$h"
  done
rm -rf "$out/boost-all" "$s/share/doc" "$s/share/man" "$s/share/lintian"
# Boost's CMake package: the headers-only component is the one find_package(Boost) needs.
find "$s/lib/x86_64-linux-gnu/cmake" -maxdepth 1 -name 'boost_*' ! -name 'boost_headers-*' -exec rm -rf {} +
# Static libraries are only needed where Debian ships nothing else (GoogleTest, RapidCheck).
find "$s/lib" -name '*.a' ! -name 'libgtest*' ! -name 'libgmock*' ! -name 'librapidcheck*' -delete
# The GPT demo's text: this machine's license texts (the GPU machine's differ, or are absent).
mkdir -p "$s/share/common-licenses"
cp -r /usr/share/common-licenses/. "$s/share/common-licenses/"
# BLIS: the library retrace opens (libblis.so.4) and its header; its BLAS face stays behind.
rm -f "$s/lib/x86_64-linux-gnu/blis-pthread/libblas.so"*
# gzip: the one compressor every machine has.
tar -C "$out/stage" -czf "$out/deps.tar.gz" usr
rm -rf "$out/stage" "$out/debs"
rm -f "$out/deps.tar.zst"
echo "pack: $(du -h "$out/deps.tar.gz" | cut -f1) in $out/deps.tar.gz (${#packages[@]} packages)"
