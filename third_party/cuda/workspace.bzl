"""@local_cuda (toolkit headers, cudart) and the shared rule for @local_nccl.

The toolkit root is $KEEL_CUDA, else /usr/local/cuda. Only --config=cuda builds use these
repositories; on a machine without the toolkit they are empty and those targets fail to build.
"""

load("@bazel_tools//tools/build_defs/repo:utils.bzl", "maybe")

def _first_existing(rctx, root, candidates):
    for candidate in candidates:
        if rctx.path(root + "/" + candidate).exists:
            return root + "/" + candidate
    return None

def local_toolkit_impl(rctx, root, lib_candidates, lib_name):
    """Symlinks root/include and lib_name into the repository and renders its BUILD template.

    Args:
      rctx: the repository context; its `_build_tpl` attribute is the template.
      root: toolkit root holding include/ and one of `lib_candidates`.
      lib_candidates: library folders under `root` to search, in order.
      lib_name: the shared library to link, e.g. "libcudart.so".
    """
    if rctx.path(root + "/include").exists:
        rctx.symlink(root + "/include", "include")
    lib_dir = _first_existing(rctx, root, [d + "/" + lib_name for d in lib_candidates])
    if lib_dir:
        lib_dir = lib_dir[:-len(lib_name) - 1]
        rctx.symlink(lib_dir + "/" + lib_name, "lib/" + lib_name)
    rctx.template("BUILD.bazel", rctx.attr._build_tpl, {
        "%{root}": root,
        "%{lib_dir}": lib_dir or root,
    })

def _cuda_impl(rctx):
    local_toolkit_impl(rctx, rctx.os.environ.get("KEEL_CUDA", "/usr/local/cuda"), ["lib64", "lib"], "libcudart.so")

_cuda = repository_rule(
    implementation = _cuda_impl,
    environ = ["KEEL_CUDA"],
    local = True,
    attrs = {"_build_tpl": attr.label(default = Label("//third_party/cuda:cuda.BUILD.tpl"))},
)

def cuda_repository():
    maybe(_cuda, name = "local_cuda")
