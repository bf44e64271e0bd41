#!/usr/bin/env bash
# On the lent GPU machine, from the repository root: unpacks what tools/device/pack.sh made into
# DEST and writes DEST/env.sh, which puts the packed Bazel on PATH and points Keel's repository
# rules and C++ toolchain at the packed Debian sysroot and the machine's PyTorch (whose torch/
# folder is the LibTorch; the repository rules find its CUDA and NCCL beside it).
#
#   tools/device/unpack.sh [PACKDIR [DEST]]        (defaults: .bazel-device, /tmp/keel-bazel)
#   . /tmp/keel-bazel/env.sh && bazel test --config=cuda //...
#
# An already-set KEEL_LIBTORCH wins over the PyTorch found here; PYTHON picks the interpreter
# whose torch to use (default python3); CC the C compiler (default: the real gcc binary, never
# a wrapper script: Bazel's sandbox must be able to run it).
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

# 2. Can this machine run Debian bookworm's binaries? (glibc and libstdc++ come from here.)
need_glibc=$(sed -n 's/^needs glibc //p' "$PACK/MANIFEST")
have_glibc=$(getconf GNU_LIBC_VERSION | awk '{print $2}')
if [ "$(printf '%s\n' "$need_glibc" "$have_glibc" | sort -V | head -1)" != "$need_glibc" ]; then
  note "WARNING: glibc $have_glibc here, the packed binaries need $need_glibc"
fi

# 3. The C compiler: the binary itself. A `gcc` on PATH may be a wrapper (ccache, a shell
#    script) whose targets Bazel's sandbox does not see; the first GPU machine's did that.
CC=${CC:-}
if [ -z "$CC" ]; then
  for candidate in /usr/bin/gcc "$(command -v gcc || true)"; do
    [ -n "$candidate" ] && [ -x "$candidate" ] || continue
    real=$(readlink -f "$candidate")
    if head -c 4 "$real" | grep -q 'ELF'; then CC=$real; break; fi
  done
fi
[ -n "$CC" ] || { note "ERROR: no gcc binary found; set CC"; exit 1; }
need_cxx=$(sed -n 's/^needs //p' "$PACK/MANIFEST" | grep GLIBCXX_ || true)
libstdcxx=$("$CC" -print-file-name=libstdc++.so.6 2>/dev/null || true)
if [ -n "$need_cxx" ] && [ -f "$libstdcxx" ] && ! grep -qa "$need_cxx" "$libstdcxx"; then
  note "WARNING: $libstdcxx lacks $need_cxx, which the packed binaries need"
fi

# 4. LibTorch: the wheel's torch/ folder (include/ + lib/); CUDA and NCCL are found beside it.
TORCH=${KEEL_LIBTORCH:-$("$PY" -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2>/dev/null || true)}
if [ -z "$TORCH" ] || [ ! -e "$TORCH/lib/libtorch.so" ] || [ ! -d "$TORCH/include" ]; then
  note "ERROR: no LibTorch with include/ and lib/libtorch.so found (torch: '${TORCH}'); set KEEL_LIBTORCH"
  exit 1
fi
# Gloo's headers must match the Gloo compiled into LibTorch: a wheel that ships them wins.
if [ -d "$TORCH/include/gloo" ]; then
  rm -rf "$SYSROOT/usr/include/gloo"
  note "Gloo headers: $TORCH/include/gloo (the wheel's)"
elif [ ! -d "$SYSROOT/usr/include/gloo" ]; then
  note "WARNING: no Gloo headers (removed for another LibTorch?); remove $DEST/MANIFEST and rerun"
fi

# 5. env.sh. BAZEL_CXXOPTS and BAZEL_LINKOPTS feed Bazel's autoconfigured C++ toolchain: the
#    sysroot's headers become built-in system headers (-isystem, so Bazel's inclusion check
#    accepts them and -Werror ignores their warnings) and its libraries are found at link and
#    run time. -std=c++0x and -lstdc++:-lm are the defaults these variables replace, kept;
#    Keel's .bazelrc adds -std=c++17. --no-as-needed undoes Ubuntu's default --as-needed, with
#    which the shared libraries of Bazel's test binaries lose the libraries they need.
cat > "$DEST/env.sh" <<ENV
export PATH="$DEST/bazel/bin:\$PATH"
export BAZEL_OUTPUT_USER_ROOT="$DEST/output_user_root"
export CC="$CC"
export KEEL_SYSROOT="$SYSROOT"
export BAZEL_CXXOPTS="-std=c++0x:-isystem:$SYSROOT/usr/include"
export BAZEL_LINKOPTS="-Wl,--no-as-needed:-lstdc++:-lm:-L$LIB:-Wl,-rpath,$LIB"
export KEEL_LIBTORCH="$TORCH"
ENV
cat "$DEST/env.sh"
"$DEST/bazel/bin/bazel" --version
