#!/usr/bin/env bash
# Builds, here, what a lent GPU machine runs without building: `--config=cuda -c opt` binaries of
# the trainer, the GPU tests and the GPU benchmarks, stripped, with the Debian libraries they load
# that the machine lacks (Abseil, protobuf, SentencePiece, Benchmark, xxhash, ...), into
# .device-bundle/ (git-ignored; carry it). LibTorch, CUDA and NCCL are the machine's own: the
# binaries were linked against the same PyTorch wheel (2.11, CUDA 13), and
# `tools/device/check.sh --prebuilt=.device-bundle` points the loader at the machine's copies.
# It saves the machine the build (a bazel, a sysroot and some minutes of its time); check.sh
# without --prebuilt builds there instead (tools/device/pack.sh). The bundle is then checked
# here, before any device time is spent: every binary finds every library it loads (the
# bundle's, then the wheel's, as check.sh points the loader), and check.sh --prebuilt's GPU
# tests run (their GPU cases skip without a GPU).
#
#   tools/device/bundle.sh [OUTDIR]
set -euo pipefail
ROOT=$(cd "$(dirname "$(readlink -f "$0")")/../.." && pwd)
OUT=$(realpath -m "${1:-$ROOT/.device-bundle}")
cd "$ROOT"

# target -> the binary's name in the bundle (tests run as plain GoogleTest binaries there).
TARGETS=(
  //tools:train
  //tools:launch
  //gradients:clip_grad_norm_benchmark
  //gradients:clip_grad_norm_torch_gpu_test
  //optim:fused_adamw_test
  //optim:fused_adamw_benchmark
  //checkpoint:checkpoint_gpu_test
  //checkpoint:checkpoint_benchmark
  //base:attention_benchmark
  //base:attention_test
  //parallel/tensor_parallel:cross_entropy_test
  //parallel/tensor_parallel:cross_entropy_benchmark
  //models:rms_norm_test
  //models:llama_blocks_benchmark
  //models:cuda_graph_benchmark
  //parallel:main_grad_test
  //gradients:main_grad_fusion_benchmark
)
OPT=(--config=cuda -c opt)
bazel build "${OPT[@]}" "${TARGETS[@]}"
BIN=$(bazel info "${OPT[@]}" bazel-bin 2>/dev/null)

rm -rf "$OUT"
mkdir -p "$OUT/bin" "$OUT/lib"
for target in "${TARGETS[@]}"; do  # bin/<package>/<name>, as under bazel-bin
  path=${target#//}
  path=${path/://}
  mkdir -p "$OUT/bin/$(dirname "$path")"
  cp "$BIN/$path" "$OUT/bin/$path"
  chmod u+w "$OUT/bin/$path"
  strip --strip-debug "$OUT/bin/$path"
done

# The shared libraries the binaries load: Keel's own that tests link dynamically (Bazel's
# _solib_ folders), and Debian's from /usr/lib, but not the C runtime (the machine's newer glibc
# and libstdc++ serve them), and nothing of LibTorch, CUDA or NCCL. ldd reads the binaries where
# Bazel built them, so that their $ORIGIN-relative paths resolve.
for target in "${TARGETS[@]}"; do
  path=${target#//}
  ldd "$BIN/${path/://}"
done 2>/dev/null | awk '/=> \// { print $3 }' | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so.* | libm.so.* | libdl.so.* | librt.so.* | libpthread.so.* | ld-linux* | \
      libstdc++.so.* | libgcc_s.so.* | libgomp*.so.*) continue ;;
  esac
  case "$lib" in
    */site-packages/* | /usr/local/cuda/*) continue ;;
    */_solib_*/* | /lib/* | /usr/lib/*) cp -L "$lib" "$OUT/lib/" ;;
  esac
done
chmod -R u+w "$OUT/lib"
strip --strip-debug "$OUT"/lib/lib*_S*.so 2>/dev/null || true
{
  echo "commit $(git rev-parse --short HEAD)$(git diff --quiet || echo ' (with uncommitted changes)')"
  echo "built $(date -u +%FT%TZ) on $(. /etc/os-release && echo "$PRETTY_NAME") with $(gcc -dumpfullversion)"
  echo "needs glibc $(ldd --version | head -1 | awk '{print $NF}')"
  echo "libtorch $("$ROOT/.venv/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null)"
} >"$OUT/MANIFEST"
du -sh "$OUT"/bin "$OUT"/lib >&2
cat "$OUT/MANIFEST"

# The check, with the loader path check.sh --prebuilt sets on the device.
torch="$ROOT/.venv/lib/python3.11/site-packages/torch"
library_path="$OUT/lib:$torch/lib"
for lib in "$torch"/../nvidia/*/lib; do library_path+=:$(realpath "$lib"); done
missing=$(find "$OUT/bin" -type f -exec env LD_LIBRARY_PATH="$library_path" ldd {} \; |
  grep "not found" | sort -u || true)
if [[ -n "$missing" ]]; then
  echo "bundle: libraries the binaries load and the device would not find:" >&2
  echo "$missing" >&2
  exit 1
fi
rm -rf /tmp/keel-device-check
PYTHON="$ROOT/.venv/bin/python" tools/device/check.sh --prebuilt="$OUT" --phases=gpu_tests \
  --report=/tmp/keel-device-check/bundle-report.md
echo "bundle: checked here (every library found; the GPU tests pass, their GPU cases skipped)"
