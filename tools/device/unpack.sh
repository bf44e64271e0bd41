#!/usr/bin/env bash
# On the lent GPU machine, from the repository root: unpacks what tools/device/pack.sh made into
# DEST and writes DEST/env.sh, which puts the packed Bazel on PATH and points Keel's repository
# rules and C++ toolchain at the packed Debian sysroot, the wheel's LibTorch, CUDA and NCCL.
# Adapted from shared/device/unpack-on-device.sh.
#
#   tools/device/unpack.sh [PACKDIR [DEST]]        (defaults: .bazel-device, /tmp/keel-bazel)
#   . /tmp/keel-bazel/env.sh && bazel test --config=cuda //...
#
# Already-set KEEL_LIBTORCH, KEEL_CUDA and KEEL_NCCL win over what is found here; PYTHON picks
# the interpreter whose torch to use (default python3).
set -euo pipefail
PACK=$(realpath "${1:-.bazel-device}")
DEST=$(realpath -m "${2:-/tmp/keel-bazel}")   # keep it outside the workspace: it holds BUILD files
SYSROOT=$DEST/sysroot
LIB=$SYSROOT/usr/lib/x86_64-linux-gnu
PY=${PYTHON:-python3}
note() { echo "unpack: $*" >&2; }

# 1. Unpack, unless this pack is unpacked there already (a second call on a warm machine then
#    keeps the trees, and always keeps Bazel's output root).
untar() {  # ARCHIVE DIR; without xz, Python's tarfile reads .tar.xz
  if command -v xz >/dev/null && command -v tar >/dev/null; then
    tar -C "$2" -xJf "$1"
  else
    "$PY" -c 'import sys, tarfile
kw = {"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}
tarfile.open(sys.argv[1]).extractall(sys.argv[2], **kw)' "$1" "$2"
  fi
}
if cmp -s "$PACK/MANIFEST" "$DEST/MANIFEST"; then
  note "already unpacked in $DEST"
else
  rm -rf "$DEST/bazel" "$SYSROOT" "$DEST/MANIFEST"
  mkdir -p "$SYSROOT"
  untar "$PACK/bazel-4.2.3-linux-x86_64.tar.xz" "$DEST"
  untar "$PACK/keel-sysroot.tar.xz" "$SYSROOT"
  cp "$PACK/MANIFEST" "$DEST/MANIFEST"
fi
rm -rf "$DEST/nccl"

# 2. Can this machine run Debian bookworm's binaries? (glibc and libstdc++ come from here.)
need_glibc=$(sed -n 's/^needs glibc //p' "$PACK/MANIFEST")
have_glibc=$(getconf GNU_LIBC_VERSION | awk '{print $2}')
if [ "$(printf '%s\n' "$need_glibc" "$have_glibc" | sort -V | head -1)" != "$need_glibc" ]; then
  note "WARNING: glibc $have_glibc here, the packed binaries need $need_glibc"
fi
need_cxx=$(sed -n 's/^needs //p' "$PACK/MANIFEST" | grep GLIBCXX_ || true)
libstdcxx=$("${CXX:-g++}" -print-file-name=libstdc++.so.6 2>/dev/null || true)
if [ -n "$need_cxx" ] && [ -f "$libstdcxx" ] && ! grep -qa "$need_cxx" "$libstdcxx"; then
  note "WARNING: $libstdcxx lacks $need_cxx, which the packed binaries need"
fi

# 3. LibTorch: the wheel's torch/ folder (include/ + lib/).
TORCH=${KEEL_LIBTORCH:-$("$PY" -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2>/dev/null || true)}
if [ -z "$TORCH" ] || [ ! -e "$TORCH/lib/libtorch.so" ] || [ ! -d "$TORCH/include" ]; then
  note "WARNING: no LibTorch with include/ and lib/libtorch.so found (torch: '${TORCH}'); set KEEL_LIBTORCH"
  TORCH=""
fi
# Gloo's headers must match the Gloo compiled into LibTorch: a wheel that ships them wins.
if [ -n "$TORCH" ] && [ -d "$TORCH/include/gloo" ]; then
  rm -rf "$SYSROOT/usr/include/gloo"
  note "Gloo headers: $TORCH/include/gloo (the wheel's)"
elif [ ! -d "$SYSROOT/usr/include/gloo" ]; then
  note "WARNING: no Gloo headers (removed for another LibTorch?); remove $DEST/MANIFEST and rerun"
fi

# 4. CUDA toolkit root (include/, lib64/libcudart.so): /usr/local/cuda, else nvcc's.
CUDA=${KEEL_CUDA:-}
if [ -z "$CUDA" ]; then
  if [ -e /usr/local/cuda/include/cuda_runtime.h ]; then CUDA=/usr/local/cuda
  elif command -v nvcc >/dev/null; then CUDA=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
  fi
fi
[ -n "$CUDA" ] || note "WARNING: no CUDA toolkit found; set KEEL_CUDA for --config=cuda"

# 5. NCCL: the library LibTorch itself loads (the nvidia-nccl wheel), with include/nccl.h beside
#    it. Wheels ship only libnccl.so.2, and Keel's rule links lib/libnccl.so: DEST/nccl adds it.
NCCL=${KEEL_NCCL:-}
if [ -z "$NCCL" ] && [ -n "$TORCH" ]; then
  soname="" so=""
  read -r soname so < <(ldd "$TORCH/lib/libtorch_cuda.so" 2>/dev/null |
    awk '/libnccl\.so/ && $3 ~ /^\// {print $1, $3; exit}') || true
  if [ -z "$so" ]; then
    for f in "$(dirname "$TORCH")"/nvidia/*/lib/libnccl.so.[0-9]; do
      if [ -e "$f" ]; then soname=$(basename "$f") so=$f; break; fi
    done
  fi
  if [ -n "$so" ]; then
    so=$(readlink -f "$so")
    root=$(dirname "$(dirname "$so")")
    if [ -e "$root/include/nccl.h" ]; then
      mkdir -p "$DEST/nccl/lib"
      ln -s "$root/include" "$DEST/nccl/include"
      ln -s "$so" "$DEST/nccl/lib/libnccl.so"
      [ "$soname" = libnccl.so ] || ln -s "$so" "$DEST/nccl/lib/$soname"
      NCCL=$DEST/nccl
      note "NCCL: $so (the one LibTorch loads), as $NCCL"
    else
      note "WARNING: no include/nccl.h beside $so"
    fi
  fi
fi
[ -n "$NCCL" ] || note "NCCL: none found; KEEL_NCCL defaults to the CUDA root"

# 6. env.sh. BAZEL_CXXOPTS and BAZEL_LINKOPTS feed Bazel's autoconfigured C++ toolchain: the
#    sysroot's headers become built-in system headers (-isystem, so Bazel's inclusion check
#    accepts them and -Werror ignores their warnings) and its libraries are found at link and
#    run time. -std=c++0x and -lstdc++:-lm are the defaults these variables replace, kept;
#    Keel's .bazelrc adds -std=c++17.
cat > "$DEST/env.sh" <<ENV
export PATH="$DEST/bazel/bin:\$PATH"
export BAZEL_OUTPUT_USER_ROOT="$DEST/output_user_root"
export KEEL_SYSROOT="$SYSROOT"
export BAZEL_CXXOPTS="-std=c++0x:-isystem:$SYSROOT/usr/include"
export BAZEL_LINKOPTS="-lstdc++:-lm:-L$LIB:-Wl,-rpath,$LIB"
${TORCH:+export KEEL_LIBTORCH="$TORCH"}
${CUDA:+export KEEL_CUDA="$CUDA"}
${NCCL:+export KEEL_NCCL="$NCCL"}
ENV
cat "$DEST/env.sh"
"$DEST/bazel/bin/bazel" --version
