"""@local_nccl: NCCL from $KEEL_NCCL, else from the CUDA toolkit root ($KEEL_CUDA or /usr/local/cuda)."""

load("@bazel_tools//tools/build_defs/repo:utils.bzl", "maybe")
load("//third_party/cuda:workspace.bzl", "local_toolkit_impl")

def _nccl_impl(rctx):
    root = rctx.os.environ.get("KEEL_NCCL", rctx.os.environ.get("KEEL_CUDA", "/usr/local/cuda"))
    local_toolkit_impl(rctx, root, ["lib", "lib64"], "libnccl.so")

_nccl = repository_rule(
    implementation = _nccl_impl,
    environ = ["KEEL_NCCL", "KEEL_CUDA"],
    local = True,
    attrs = {"_build_tpl": attr.label(default = Label("//third_party/nccl:nccl.BUILD.tpl"))},
)

def nccl_repository():
    maybe(_nccl, name = "local_nccl")
