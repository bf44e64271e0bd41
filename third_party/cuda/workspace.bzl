"""@local_cuda (CUDA headers and runtime), @local_nvcc (the compiler of Keel's CUDA kernels) and
the shared rule for @local_nccl.

The CUDA that LibTorch loads, first found: $KEEL_CUDA (a toolkit root: include/ and lib64/ or
lib/); the nvidia/cuXX folder beside a wheel's torch/ (what its libtorch_cuda.so loads through
its rpath); /usr/local/cuda. Keel's binaries then load the same libcudart as LibTorch.
Libraries are linked by their real path (a wheel ships only libcudart.so.13), with an rpath to
their folder. Only a LibTorch with CUDA (@libtorch) and --config=cuda use these repositories;
without any CUDA their targets fail to build, saying so.

@local_nvcc//:nvcc.bzl defines NVCC, the absolute path of the first found of $KEEL_NVCC,
bin/nvcc under $KEEL_CUDA, /usr/local/cuda/bin/nvcc and nvcc on PATH, or "" (cuda_objects then
fails, saying so; CPU builds never run it).
"""

load("@bazel_tools//tools/build_defs/repo:utils.bzl", "maybe")
load("//third_party/libtorch:workspace.bzl", "find_libtorch")

def _library(rctx, lib_dir, name):
    """The path of lib_dir/name.so, else of its highest-numbered name.so.N, else None."""
    if rctx.path(lib_dir + "/" + name + ".so").exists:
        return lib_dir + "/" + name + ".so"
    if not rctx.path(lib_dir).exists:
        return None
    versioned = sorted([
        str(p)
        for p in rctx.path(lib_dir).readdir()
        if p.basename.startswith(name + ".so.") and p.basename[len(name) + 4:].isdigit()
    ])
    return versioned[-1] if versioned else None

def local_library_impl(rctx, roots, lib_name, header, expose_headers = [], skip_headers = []):
    """Renders rctx.attr._build_tpl for the first root that has `header` and `lib_name`.

    Symlinks the root's include/ entries that start with one of `expose_headers` (all when
    empty) and with none of `skip_headers` into include/; the template gets %{root},
    %{library} (the library's real path), %{lib_dir} and %{found} ("touch $@"), or, when no root
    has both, empty values and a %{found} that fails saying what was looked for.

    Args:
      rctx: the repository context; its `_build_tpl` attribute is the template.
      roots: (folder, where it came from) pairs, in order of preference; folders may be None.
      lib_name: the library without suffix, e.g. "libcudart".
      header: a header that the root's include/ must hold, e.g. "cuda_runtime_api.h".
      expose_headers: prefixes of the include/ entries to expose; empty for all.
      skip_headers: prefixes of include/ entries not to expose.
    """
    looked = []
    for root, origin in roots:
        if not root:
            continue
        looked.append("%s (%s)" % (root, origin))
        library = None
        for lib_dir in [root + "/lib64", root + "/lib"]:
            library = library or _library(rctx, lib_dir, lib_name)
        if not rctx.path(root + "/include/" + header).exists or not library:
            continue
        for entry in rctx.path(root + "/include").readdir():
            name = entry.basename
            if expose_headers and not [p for p in expose_headers if name.startswith(p)]:
                continue
            if not [p for p in skip_headers if name.startswith(p)]:
                rctx.symlink(entry, "include/" + name)
        rctx.template("BUILD.bazel", rctx.attr._build_tpl, {
            "%{root}": "%s (%s)" % (root, origin),
            "%{library}": library,
            "%{lib_dir}": str(rctx.path(library).dirname),
            "%{found}": "touch $@",
        })
        return
    missing = "%s: no include/%s with %s.so in %s" % (rctx.name, header, lib_name, ", ".join(looked) or "any folder")
    rctx.template("BUILD.bazel", rctx.attr._build_tpl, {
        "%{root}": "none",
        "%{library}": "",
        "%{lib_dir}": "",
        "%{found}": "echo '%s' >&2; exit 1" % missing.replace("'", ""),
    })

def wheel_folder(rctx, prefix):
    """The folder nvidia/<prefix> or nvidia/<prefix><N> (highest N) beside the wheel's torch/
    of find_libtorch, or None."""
    found = find_libtorch(rctx)
    if not found or not found.site_packages:
        return None
    nvidia = rctx.path(found.site_packages + "/nvidia")
    if not nvidia.exists:
        return None
    matches = sorted([
        str(p)
        for p in nvidia.readdir()
        if p.basename == prefix or (p.basename.startswith(prefix) and p.basename[len(prefix):].isdigit())
    ])
    return matches[-1] if matches else None

def _cuda_impl(rctx):
    local_library_impl(
        rctx,
        roots = [
            (rctx.os.environ.get("KEEL_CUDA"), "KEEL_CUDA"),
            (wheel_folder(rctx, "cu"), "the CUDA of LibTorch's wheel"),
            ("/usr/local/cuda", "the CUDA toolkit"),
        ],
        lib_name = "libcudart",
        header = "cuda_runtime_api.h",
        # NCCL comes from @local_nccl (the NCCL LibTorch loads), never from a toolkit's include/.
        skip_headers = ["nccl"],
    )

_cuda = repository_rule(
    implementation = _cuda_impl,
    environ = ["KEEL_CUDA", "KEEL_LIBTORCH"],
    local = True,
    attrs = {"_build_tpl": attr.label(default = Label("//third_party/cuda:cuda.BUILD.tpl"))},
)

def _nvcc_impl(rctx):
    candidates = [rctx.os.environ.get("KEEL_NVCC")]
    if rctx.os.environ.get("KEEL_CUDA"):
        candidates.append(rctx.os.environ.get("KEEL_CUDA") + "/bin/nvcc")
    candidates.append("/usr/local/cuda/bin/nvcc")
    on_path = rctx.which("nvcc")
    if on_path:
        candidates.append(str(on_path))
    found = ""
    for candidate in candidates:
        if candidate and rctx.path(candidate).exists:
            found = str(rctx.path(candidate).realpath)
            break
    rctx.file("BUILD.bazel", "exports_files([\"nvcc.bzl\"])\n")
    rctx.file("nvcc.bzl", "# Generated by //third_party/cuda:workspace.bzl.\nNVCC = \"%s\"\n" % found)

_nvcc = repository_rule(
    implementation = _nvcc_impl,
    environ = ["KEEL_NVCC", "KEEL_CUDA", "PATH"],
    local = True,
)

def cuda_repository():
    maybe(_cuda, name = "local_cuda")
    maybe(_nvcc, name = "local_nvcc")
