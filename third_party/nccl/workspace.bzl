"""@local_nccl: the NCCL that LibTorch loads, first found: $KEEL_NCCL; nvidia/nccl beside a
wheel's torch/; the CUDA root ($KEEL_CUDA or /usr/local/cuda). c10d compiles against its nccl.h
(ProcessGroupNCCL's options depend on the NCCL version); only cuda_link_test links it.
"""

load("@bazel_tools//tools/build_defs/repo:utils.bzl", "maybe")
load("//third_party/cuda:workspace.bzl", "local_library_impl", "wheel_folder")

def _nccl_impl(rctx):
    local_library_impl(
        rctx,
        roots = [
            (rctx.os.environ.get("KEEL_NCCL"), "KEEL_NCCL"),
            (wheel_folder(rctx, "nccl"), "the NCCL of LibTorch's wheel"),
            (rctx.os.environ.get("KEEL_CUDA", "/usr/local/cuda"), "the CUDA toolkit"),
        ],
        lib_name = "libnccl",
        header = "nccl.h",
        # A toolkit's include/ holds all of CUDA's headers: only NCCL's come from here.
        expose_headers = ["nccl"],
    )

_nccl = repository_rule(
    implementation = _nccl_impl,
    environ = ["KEEL_NCCL", "KEEL_CUDA", "KEEL_LIBTORCH"],
    local = True,
    attrs = {"_build_tpl": attr.label(default = Label("//third_party/nccl:nccl.BUILD.tpl"))},
)

def nccl_repository():
    maybe(_nccl, name = "local_nccl")
