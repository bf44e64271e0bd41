#!/usr/bin/env bash
# Packs what Keel's Bazel build needs on a lent GPU machine that has no Java, no Bazel, no apt
# and no network (x86-64, glibc and libstdc++ at least Debian bookworm's; PyTorch wheel for
# LibTorch, nvcc for CUDA): Debian's Bazel 4.2.3 with a jlink'd JRE, and a sysroot of the
# Debian files Keel's repository rules and toolchain read that the wheel does not provide.
# Adapted from shared/device/pack-bazel-for-device.sh.
#
#   tools/device/pack.sh [OUTDIR]        (default: .bazel-device, git-ignored)
#
# OUTDIR gets bazel-4.2.3-linux-x86_64.tar.xz, keel-sysroot.tar.xz and MANIFEST. Carry OUTDIR
# with the device tool, then on the device: tools/device/unpack.sh && . /tmp/keel-bazel/env.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$(readlink -f "$0")")/../.." && pwd)
OUT=$(realpath -m "${1:-$ROOT/.bazel-device}")
JDK=${JDK:-/usr/lib/jvm/java-17-openjdk-amd64}
# xz threads: 0 = all cores. XZ_THREADS=1 nice tools/device/pack.sh leaves a shared machine alone.
XZ=(xz -9 -T"${XZ_THREADS:-0}")
MA=x86_64-linux-gnu
# Modules the Bazel server needed in trials (build, test, query, asan/opt/cuda configs). The
# full `jdeps --print-module-deps A-server.jar` list adds java.compiler, java.desktop,
# java.instrument and jdk.sctp (+4 MiB xz): set MODULES to it if a command hits NoClassDefFoundError.
MODULES=${MODULES:-java.base,java.logging,java.management,java.naming,java.sql,java.xml,jdk.management,jdk.unsupported}
# What third_party/ maps (see each system.BUILD.bazel) and @rules_java, with the runtime
# libraries the -dev packages' .so links point to. libgloo-dev: headers only (LibTorch has Gloo).
# sentencepiece: spm_train and spm_encode, which tests run (@sentencepiece//:spm_train).
SYSROOT_PKGS=(libabsl-dev libabsl20220623 libprotobuf-dev libprotobuf32 libprotoc32 protobuf-compiler
  libgtest-dev libgmock-dev libbenchmark-dev libbenchmark1debian libxxhash-dev libxxhash0
  nlohmann-json3-dev libgloo-dev libsentencepiece-dev libsentencepiece0 sentencepiece
  bazel-rules-java)

need() { dpkg -s "$1" >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq "$@" >/dev/null; }; }
need bazel-bootstrap; need openjdk-17-jdk-headless; need patchelf; need xz-utils; need binutils
for p in "${SYSROOT_PKGS[@]}"; do need "$p"; done

STAGE=$(mktemp -d); trap 'rm -rf "$STAGE"' EXIT
B=$STAGE/bazel
mkdir -p "$B/bin" "$B/lib" "$OUT"

# 1. Install base: /usr/share/bazel with its symlinks (into /usr/libexec, /usr/lib) resolved.
cp -rL /usr/share/bazel "$B/install"
# 2. Client (/usr/bin/bazel is only a version-picking shell wrapper; bazel-4 is the real client).
cp /usr/bin/bazel-4 "$B/bin/bazel-real"
# 3. Shared libraries the client and the sandbox/process-wrapper need (grpc, absl, protobuf, upb,
#    cares, ...); glibc, libstdc++, libgcc_s and zlib are left to the target system.
for f in "$B/bin/bazel-real" "$B"/install/{process-wrapper,linux-sandbox,build-runfiles,daemonize}; do
  ldd "$f" | awk '/=>/ {print $3}'
done | sort -u | grep -vE '/lib(c|m|stdc\+\+|gcc_s|z|pthread|dl|rt)\.so' | while read -r l; do
  cp -L "$l" "$B/lib/"
done
# DT_RPATH (not RUNPATH) so that the libraries' own dependencies resolve from lib/ too.
patchelf --force-rpath --set-rpath '$ORIGIN/../lib' "$B/bin/bazel-real"
for f in process-wrapper linux-sandbox; do
  patchelf --force-rpath --set-rpath '$ORIGIN/../lib' "$B/install/$f"
done
# 4. Minimal JRE for the Bazel server (jlink; no --compress so that xz does better).
"$JDK/bin/jlink" --module-path "$JDK/jmods" --add-modules "$MODULES" \
  --strip-debug --no-man-pages --no-header-files --output "$B/jre"
find "$B/jre" -name '*.so' -exec strip --strip-unneeded {} +
# 5. Launcher: fixed startup flags, never the system JDK, /etc/bazel.bazelrc or /usr/share/bazel.
cat > "$B/bin/bazel" <<'WRAP'
#!/bin/sh
d=$(dirname "$(readlink -f "$0")")/..
exec "$d/bin/bazel-real" --nosystem_rc --install_base="$d/install" --trust_install_base \
  --server_javabase="$d/jre" ${BAZEL_OUTPUT_USER_ROOT:+--output_user_root=$BAZEL_OUTPUT_USER_ROOT} "$@"
WRAP
chmod +x "$B/bin/bazel"

# 6. Sysroot: the packages' installed files under their own paths (usr/include, usr/lib/<multiarch>,
#    usr/bin/protoc, usr/share/bazel/rules/java), read through KEEL_SYSROOT and the toolchain
#    flags that unpack.sh sets. Static archives only where Debian ships nothing else (gtest,
#    gmock, benchmark_main); no docs, pkg-config, CMake files or sources.
R=$STAGE/sysroot
dpkg -L "${SYSROOT_PKGS[@]}" | sort -u | while read -r f; do
  case "$f" in
    /usr/share/bazel/rules/java/*) ;;
    /usr/share/*|/usr/src/*|*/pkgconfig/*|*/cmake/*|/usr/lib/libgloo*) continue ;;
    /usr/bin/spm_*) case "$f" in */spm_train|*/spm_encode) ;; *) continue ;; esac ;;
    *.a) case "$f" in */libgtest*|*/libgmock*|*/libbenchmark_main.a) ;; *) continue ;; esac ;;
  esac
  if [ -L "$f" ] || [ -f "$f" ]; then mkdir -p "$R$(dirname "$f")"; cp -P "$f" "$R$f"; fi
done
# protoc runs inside Bazel actions, and tests run spm_train and spm_encode, with no
# LD_LIBRARY_PATH.
for tool in protoc spm_train spm_encode; do
  patchelf --force-rpath --set-rpath "\$ORIGIN/../lib/$MA" "$R/usr/bin/$tool"
done

# 7. What the device must offer: the newest glibc / libstdc++ symbol versions any packed ELF needs.
max_ver() {  # PREFIX: highest PREFIX<version> among the packed ELF files' needed symbol versions
  find "$STAGE" -type f \( -perm -u+x -o -name '*.so*' \) -exec objdump -T {} + 2>/dev/null |
    grep -oE "\(?$1[0-9.]+" | tr -d '(' | sed "s/^$1//" | sort -uV | tail -1
}
{
  echo "packed $(date -u +%FT%TZ) on $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "needs glibc $(max_ver GLIBC_)"
  echo "needs GLIBCXX_$(max_ver GLIBCXX_)"
  dpkg-query -W -f='${Package} ${Version}\n' bazel-bootstrap "${SYSROOT_PKGS[@]}"
} > "$OUT/MANIFEST"

tar -C "$STAGE" -cf - bazel | "${XZ[@]}" > "$OUT/bazel-4.2.3-linux-x86_64.tar.xz"
tar -C "$R" -cf - . | "${XZ[@]}" > "$OUT/keel-sysroot.tar.xz"
du -b "$OUT"/* | awk '{printf "%8.1f MiB  %s\n", $1/1048576, $2}'
