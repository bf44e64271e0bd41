#!/usr/bin/env bash
# Installs every Debian package Keel needs to build, test and run (Debian bookworm).
# Idempotent: packages already present are reported and left alone; safe to run twice.
set -euo pipefail

# One line per package: what it brings.
readonly PACKAGES=(
  bazel-bootstrap     # Bazel 4.2.3 (WORKSPACE mode)
  bazel-rules-java    # @rules_java for offline Bazel
  build-essential     # g++ and the C++ standard library
  libtorch-dev        # LibTorch 1.13.1 (CPU) with c10d
  libopenblas0-pthread  # OpenBLAS as libblas.so.3: LibTorch's sgemm is ~15x slower on the reference BLAS
  libgloo-dev         # Gloo headers that c10d's ProcessGroupGloo.hpp includes
  libabsl-dev         # Abseil (status, strings, flags)
  libprotobuf-dev     # protobuf runtime, the one LibTorch links
  protobuf-compiler   # protoc for proto_library / cc_proto_library
  libgtest-dev        # GoogleTest
  libgmock-dev        # GoogleMock
  libbenchmark-dev    # Google Benchmark
  nlohmann-json3-dev  # JSON behind //base:json (golden files, parity tool)
  libxxhash-dev       # XXH3 checksums of checkpoint shards and manifests
  libsentencepiece-dev  # SentencePiece tokenization in tools:preprocess --tokenizer_model
  sentencepiece       # spm_encode: the reference ids in tests, the baseline of preprocess_benchmark.sh
  python3-sentencepiece  # the Python baseline of tools/scripts/preprocess_benchmark.sh
  clang               # clang++ for libFuzzer builds (sampling/index_format_fuzz_test.cc)
  libclang-rt-14-dev  # libFuzzer and the sanitizer runtimes for clang
  python3-torch       # torchrun (tools:train_test) and the Python baseline of tools/scripts/train_benchmark.sh
  python3-numpy       # numpy's RandomState: the cross-checks and Megatron baseline of tools/scripts/gpt_index_benchmark.py
  python3-pybind11    # compiles Megatron-LM's helpers.cpp for tools/scripts/gpt_index_benchmark.py
)

sudo_cmd=()
if [[ "$(id -u)" != 0 ]]; then sudo_cmd=(sudo); fi

missing=()
for pkg in "${PACKAGES[@]}"; do
  if dpkg-query -W -f='${Status}' "${pkg}" 2>/dev/null | grep -q "install ok installed"; then
    echo "bootstrap: ${pkg} already installed"
  else
    missing+=("${pkg}")
  fi
done

if ((${#missing[@]} > 0)); then
  echo "bootstrap: installing ${missing[*]}"
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "bootstrap: all ${#PACKAGES[@]} Debian packages present, nothing to install"
fi

# buildifier (BUILD-file formatter) comes from the npm registry into tools/node_modules (git-ignored).
# The machine image ships Node.js with npm; Debian's npm is installed only where npm is missing.
if ! command -v npm >/dev/null; then
  echo "bootstrap: installing npm"
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends npm
fi
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -x "${repo_root}/tools/node_modules/.bin/buildifier" ]]; then
  echo "bootstrap: buildifier already installed"
else
  echo "bootstrap: installing buildifier into tools/node_modules"
  npm install --silent --no-audit --no-fund --prefix "${repo_root}/tools" @bazel/buildifier@8.2.1
fi
echo "bootstrap: done"
