#!/usr/bin/env bash
# Installs everything Keel needs to build, test and run on Debian bookworm: Debian's packages,
# and PyTorch 2.11.0 from PyPI (its CUDA 13 build) in a project-local Python environment,
# .venv/ (git-ignored), whose torch/ folder is the LibTorch Bazel uses unless KEEL_LIBTORCH
# names another (third_party/libtorch/workspace.bzl), and whose torchrun and Python the tests
# and the Python baselines use; with it, the pinned transformers and safetensors that
# tools/scripts/hf_parity.py records testdata/hf_parity/ with, peft for its LoRA adapter
# fixture and check, and pybind11 for the Megatron helpers that
# tools/scripts/gpt_index_benchmark.py compiles.
# Idempotent: what is already present is reported and left alone; safe to run twice.
set -euo pipefail

# One line per package: what it brings.
readonly PACKAGES=(
  bazel-bootstrap     # Bazel 4.2.3 (WORKSPACE mode)
  bazel-rules-java    # @rules_java for offline Bazel
  build-essential     # g++ and the C++ standard library
  python3-venv        # the project-local environment that holds PyTorch 2.11 (.venv)
  libgloo-dev         # Gloo headers that c10d's ProcessGroupGloo.hpp includes (the wheel has none)
  libabsl-dev         # Abseil (status, strings, flags)
  libprotobuf-dev     # protobuf runtime (checkpoint manifests, configs)
  protobuf-compiler   # protoc for proto_library / cc_proto_library
  libgtest-dev        # GoogleTest
  libgmock-dev        # GoogleMock
  libbenchmark-dev    # Google Benchmark
  nlohmann-json3-dev  # JSON behind //base:json (golden files, parity tool)
  libxxhash-dev       # XXH3 checksums of checkpoint shards and manifests
  libsentencepiece-dev  # SentencePiece tokenization in tools:preprocess --tokenizer_model
  sentencepiece       # spm_train and spm_encode: the reference ids in tests, the baseline of preprocess_benchmark.sh
  python3-sentencepiece  # the Python baseline of tools/scripts/preprocess_benchmark.sh
  clang               # clang++ for libFuzzer builds (sampling/index_format_fuzz_test.cc)
  libclang-rt-14-dev  # libFuzzer and the sanitizer runtimes for clang
  python3-dev         # Python.h for Megatron-LM's helpers.cpp, which tools/scripts/gpt_index_benchmark.py compiles
)

# What .venv holds: PyPI's torch 2.11.0 (CUDA 13.0, with its nvidia-* libraries: cuDNN, NCCL,
# cuBLAS, ...) and numpy, which torch's Python side imports; transformers (the newest PyPI release
# when it was pinned, checked with this torch) and safetensors, for tools/scripts/hf_parity.py;
# peft (the newest PyPI release when it was pinned, checked with this torch and transformers),
# for hf_parity.py's LoRA adapters; pybind11 for tools/scripts/gpt_index_benchmark.py.
# pip adds what they depend on (huggingface_hub, tokenizers, ...) at the versions it resolves.
readonly TORCH_VERSION=2.11.0
readonly TRANSFORMERS_VERSION=5.24.0
readonly SAFETENSORS_VERSION=0.8.0
readonly PEFT_VERSION=0.21.2
readonly PYBIND11_VERSION=3.1.0
readonly PYTHON_PACKAGES=("torch==${TORCH_VERSION}" "numpy==2.3.5"
                          "transformers==${TRANSFORMERS_VERSION}" "safetensors==${SAFETENSORS_VERSION}"
                          "peft==${PEFT_VERSION}" "pybind11==${PYBIND11_VERSION}")

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

# The project-local environment, made with Debian's Python 3.11 (the interpreter the wheel's
# cp311 build is for), whatever else `python3` names on this machine.
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${repo_root}/.venv"
has_torch="import sys, torch, numpy; sys.exit(torch.__version__.split('+')[0] != '${TORCH_VERSION}')"
# -P: the checkout's own peft/ (Keel's C++ package) must not stand in for Python's peft.
has_hf="import sys, transformers, safetensors, peft, pybind11; sys.exit(transformers.__version__ != '${TRANSFORMERS_VERSION}' or safetensors.__version__ != '${SAFETENSORS_VERSION}' or peft.__version__ != '${PEFT_VERSION}' or pybind11.__version__ != '${PYBIND11_VERSION}')"
hf_versions="transformers ${TRANSFORMERS_VERSION}, safetensors ${SAFETENSORS_VERSION}, peft ${PEFT_VERSION} and pybind11 ${PYBIND11_VERSION}"
if "${venv}/bin/python" -P -c "${has_torch}" 2>/dev/null && "${venv}/bin/python" -P -c "${has_hf}" 2>/dev/null; then
  echo "bootstrap: ${venv} holds torch ${TORCH_VERSION}, ${hf_versions} already"
elif "${venv}/bin/python" -P -c "${has_torch}" 2>/dev/null; then
  # torch==2.11.0 is already satisfied, so pip leaves torch as it is and adds the rest.
  echo "bootstrap: ${venv} holds torch ${TORCH_VERSION}; installing ${hf_versions}"
  "${venv}/bin/python" -m pip install --quiet --disable-pip-version-check "${PYTHON_PACKAGES[@]}"
else
  echo "bootstrap: installing ${PYTHON_PACKAGES[*]} from PyPI into ${venv} (about 3 GiB)"
  /usr/bin/python3 -m venv "${venv}"
  "${venv}/bin/python" -m pip install --quiet --disable-pip-version-check "${PYTHON_PACKAGES[@]}"
fi
"${venv}/bin/python" -c 'import torch; print("bootstrap: LibTorch", torch.__version__, "CUDA", torch.version.cuda, "at", torch.__path__[0])'
echo "bootstrap: done"
