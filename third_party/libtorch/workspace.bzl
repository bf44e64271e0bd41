"""@libtorch: LibTorch from $KEEL_LIBTORCH, else Debian's libtorch-dev.

KEEL_LIBTORCH names a folder with include/ and lib/: the layout of a PyTorch wheel's torch/
folder (used on GPU machines, e.g. .../site-packages/torch). Without it, Debian's layout is
used: headers in /usr/include/{torch,ATen,c10,caffe2}, libraries in /usr/lib/<multiarch>.
Either way the headers and libraries are symlinked into the repository so Bazel tracks them.
"""

load("@bazel_tools//tools/build_defs/repo:utils.bzl", "maybe")

_DEBIAN_INCLUDE = "/usr/include"
_DEBIAN_LIB = "/usr/lib/x86_64-linux-gnu"
_HEADER_DIRS = ["torch", "ATen", "c10", "caffe2"]
_LIBS = ["libtorch.so", "libtorch_cpu.so", "libc10.so", "libtorch_cuda.so", "libc10_cuda.so"]

def _libtorch_impl(rctx):
    root = rctx.os.environ.get("KEEL_LIBTORCH", "")
    if root:
        include_dir, lib_dir, layout = root + "/include", root + "/lib", "KEEL_LIBTORCH"
        if not rctx.path(include_dir).exists or not rctx.path(lib_dir).exists:
            fail("KEEL_LIBTORCH=%s must be a folder with include/ and lib/ (a wheel's torch/ folder)" % root)
        rctx.symlink(include_dir, "include")
    else:
        root, include_dir, lib_dir, layout = "/usr", _DEBIAN_INCLUDE, _DEBIAN_LIB, "Debian libtorch-dev"
        for name in _HEADER_DIRS:
            if not rctx.path(include_dir + "/" + name).exists:
                fail("%s/%s is missing: run tools/bootstrap.sh or set KEEL_LIBTORCH" % (include_dir, name))
            rctx.symlink(include_dir + "/" + name, "include/" + name)

    # Keel links Debian's C++ libraries (Abseil, protobuf), built with the C++11 ABI.
    for config in ["share/cmake/Torch/TorchConfig.cmake", "lib/x86_64-linux-gnu/cmake/Torch/TorchConfig.cmake"]:
        path = rctx.path(root + "/" + config)
        if path.exists and "_GLIBCXX_USE_CXX11_ABI=0" in rctx.read(path):
            fail("LibTorch at %s uses the pre-C++11 ABI; Keel needs a cxx11-ABI LibTorch" % root)

    libs = []
    for lib in _LIBS:
        if rctx.path(lib_dir + "/" + lib).exists:
            rctx.symlink(lib_dir + "/" + lib, "lib/" + lib)
            libs.append('"lib/%s"' % lib)
    if "libtorch.so" not in [lib[5:-1] for lib in libs]:
        fail("no libtorch.so in %s" % lib_dir)

    linkopts = ['"-Wl,-rpath,%s"' % lib_dir, '"-pthread"']
    defines = ['"KEEL_LIBTORCH_HAS_CUDA"'] if '"lib/libtorch_cuda.so"' in libs else []
    rctx.template("BUILD.bazel", rctx.attr._build_tpl, {
        "%{root}": root,
        "%{layout}": layout,
        "%{libs}": ", ".join(libs),
        "%{linkopts}": ", ".join(linkopts),
        "%{defines}": ", ".join(defines),
        # Spelled with an explicit repository ("@//..." when Keel is the main workspace), so it
        # does not resolve inside @libtorch.
        "%{cuda_enabled}": "@%s//%s:%s" % (
            rctx.attr._cuda_enabled.workspace_name,
            rctx.attr._cuda_enabled.package,
            rctx.attr._cuda_enabled.name,
        ),
    })

_libtorch = repository_rule(
    implementation = _libtorch_impl,
    environ = ["KEEL_LIBTORCH"],
    local = True,
    attrs = {
        "_build_tpl": attr.label(default = Label("//third_party/libtorch:libtorch.BUILD.tpl")),
        "_cuda_enabled": attr.label(default = Label("//third_party/cuda:enabled")),
    },
)

def libtorch_repository():
    maybe(_libtorch, name = "libtorch")
