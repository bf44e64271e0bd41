"""cuda_objects: .cu sources compiled by the CUDA toolkit's nvcc (@local_nvcc) into objects
that a cc_library takes as srcs, for sm_90 and sm_80 with PTX of compute_90 for later GPUs.

    cuda_objects(name = "kernels_cuda", srcs = ["kernels.cu"], hdrs = ["kernels.h"])
    cc_library(
        name = "kernels",
        srcs = ["kernels.h", ...] + select({
            "//third_party/cuda:enabled": [":kernels_cuda"],
            "//conditions:default": [],
        }),
        deps = ["@libtorch//:torch"],  # with CUDA, it brings @local_cuda//:cudart
    )

The cc_library's headers and deps are the same in both builds: a header set that differs under
--config=cuda changes the compile actions of every target above it, and the switch from the
plain build then compiles them all again (only the objects and the links may differ).

The sources include the toolkit's headers and headers of this workspace (from its root), not
LibTorch's: a kernel takes raw pointers, and a .cc beside it adapts tensors.
"""

load("@local_nvcc//:nvcc.bzl", "NVCC")

# Real architectures compiled to machine code; PTX of the newest for the GPUs after it.
_ARCHS = ["80", "90"]

def _cuda_objects_impl(ctx):
    if not NVCC:
        fail("%s: no nvcc (set KEEL_NVCC, or KEEL_CUDA to a CUDA toolkit)" % ctx.label)
    objects = []
    for src in ctx.files.srcs:
        out = ctx.actions.declare_file("%s/%s.pic.o" % (ctx.label.name, src.basename[:-len(".cu")]))
        args = ctx.actions.args()
        args.add_all(["-c", "-O3", "-std=c++17", "-Xcompiler=-fPIC,-Wall", "-I."])
        for arch in _ARCHS:
            args.add("-gencode=arch=compute_%s,code=sm_%s" % (arch, arch))
        args.add("-gencode=arch=compute_%s,code=compute_%s" % (_ARCHS[-1], _ARCHS[-1]))
        args.add_all(["-o", out, src])
        ctx.actions.run(
            executable = NVCC,
            arguments = [args],
            inputs = ctx.files.srcs + ctx.files.hdrs,
            outputs = [out],
            mnemonic = "Nvcc",
            progress_message = "Compiling %s with nvcc" % src.short_path,
            # nvcc runs the host compiler (gcc) from PATH.
            use_default_shell_env = True,
        )
        objects.append(out)
    return [DefaultInfo(files = depset(objects))]

cuda_objects = rule(
    implementation = _cuda_objects_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"], mandatory = True),
        "hdrs": attr.label_list(allow_files = [".h"]),
    },
)
