"""@libtorch: the LibTorch Keel builds against, and the Python and torchrun of the same PyTorch.

Where LibTorch comes from (`find_libtorch`):
  1. $KEEL_LIBTORCH: a folder with include/ and lib/ (a PyTorch wheel's torch/ folder, or a
     LibTorch archive from pytorch.org, unpacked).
  2. <keel>/.venv/lib/python3.*/site-packages/torch: PyTorch 2.11.0 from PyPI, which
     tools/bootstrap.sh installs.
Supported: LibTorch 2.6 or later, built with the C++11 ABI; anything else fails here,
naming the version. Only LibTorch's own header folders are exposed (never a wheel's bundled
protobuf or pybind11), and its libraries are linked by their real paths with an rpath to
their folder, so that a wheel's libtorch_cuda.so finds nvidia/*/lib through its own $ORIGIN
rpath, with no LD_LIBRARY_PATH. A LibTorch with CUDA (lib/libtorch_cuda.so) brings
@local_cuda (headers, cudart) and, for c10d, @local_nccl: the NCCL it loads.
"""

load("@bazel_tools//tools/build_defs/repo:utils.bzl", "maybe")

_HEADER_DIRS = ["torch", "ATen", "c10", "caffe2"]
_VERSION_HEADERS = ["torch/headeronly/version.h", "torch/csrc/api/include/torch/version.h"]

def _bootstrapped_torch(rctx):
    """<keel>/.venv/lib/python3.*/site-packages/torch, or None."""
    keel_root = rctx.path(Label("//:repositories.bzl")).dirname
    lib = keel_root.get_child(".venv").get_child("lib")
    if not lib.exists:
        return None
    for python in sorted([str(p) for p in lib.readdir()]):
        torch = python + "/site-packages/torch"
        if rctx.path(torch + "/include").exists:
            return torch
    return None

def find_libtorch(rctx):
    """The LibTorch to build against, or None when there is none.

    Args:
      rctx: a repository context whose rule lists KEEL_LIBTORCH in `environ`.

    Returns:
      struct(root, include_dir, lib_dir, site_packages, origin): `site_packages` is the folder
      holding torch/ and nvidia/ for a wheel (None otherwise); `origin` says where it was found.
    """
    root = rctx.os.environ.get("KEEL_LIBTORCH", "")
    origin = "KEEL_LIBTORCH=" + root
    if not root:
        root = _bootstrapped_torch(rctx)
        origin = "the .venv of tools/bootstrap.sh"
        if not root:
            return None
    root = str(rctx.path(root).realpath)
    lib_dir = root + "/lib"
    parent = rctx.path(root).dirname
    site_packages = str(parent) if parent.basename in ["site-packages", "dist-packages"] else None
    return struct(root = root, include_dir = root + "/include", lib_dir = lib_dir, site_packages = site_packages, origin = origin)

def _version(rctx, include_dir):
    for header in _VERSION_HEADERS:
        path = rctx.path(include_dir + "/" + header)
        if not path.exists:
            continue
        fields = {}
        for line in rctx.read(path).splitlines():
            words = [w for w in line.replace("\t", " ").split(" ") if w]
            if len(words) == 3 and words[0] == "#define" and words[1] in ["TORCH_VERSION_MAJOR", "TORCH_VERSION_MINOR", "TORCH_VERSION_PATCH"]:
                fields[words[1]] = int(words[2])
        if len(fields) == 3:
            return (fields["TORCH_VERSION_MAJOR"], fields["TORCH_VERSION_MINOR"], fields["TORCH_VERSION_PATCH"])
    return None

def _check(rctx, found):
    """Fails unless `found` is a supported LibTorch; returns its (major, minor, patch)."""
    where = "LibTorch at %s (%s)" % (found.root, found.origin)
    for name in _HEADER_DIRS:
        if not rctx.path(found.include_dir + "/" + name).exists:
            fail("%s has no include/%s: KEEL_LIBTORCH must name a folder with include/ and lib/ (a wheel's torch/ folder or an unpacked LibTorch archive)" % (where, name))
    for lib in ["libtorch.so", "libtorch_cpu.so", "libc10.so"]:
        if not rctx.path(found.lib_dir + "/" + lib).exists:
            fail("%s has no %s in %s" % (where, lib, found.lib_dir))
    version = _version(rctx, found.include_dir)
    if not version:
        fail("%s: no TORCH_VERSION_MAJOR/MINOR/PATCH in include/{%s}" % (where, ",".join(_VERSION_HEADERS)))
    major, minor, patch = version
    if (major, minor) < (2, 6):
        fail("%s is version %d.%d.%d; Keel supports LibTorch 2.6 or later" % (where, major, minor, patch))

    # Keel links Debian's C++ libraries (Abseil, protobuf), built with the C++11 ABI, so
    # LibTorch's std::string must be std::__cxx11::basic_string too: libc10.so says which.
    libc10 = found.lib_dir + "/libc10.so"
    if rctx.execute(["grep", "-q", "-a", "_ZNSt7__cxx11", libc10]).return_code != 0:
        fail("%s was built with the pre-C++11 ABI (no std::__cxx11 symbol in %s); Keel needs a cxx11-ABI LibTorch (every PyPI wheel since 2.6, the cxx11-abi archives)" % (where, libc10))
    return version

def _python(rctx, found, version):
    """(interpreter, why_not): the Python whose `import torch` is this LibTorch's PyTorch."""
    if found.site_packages and found.site_packages.endswith("/site-packages"):
        # <prefix>/lib/pythonX.Y/site-packages/torch: a venv or an installation under <prefix>.
        candidate = str(rctx.path(found.site_packages).dirname.dirname.dirname) + "/bin/python3"
    elif found.site_packages:
        candidate = "/usr/bin/python3"  # a system Python's dist-packages
    else:
        return None, "LibTorch at %s is not part of a Python installation (an unpacked LibTorch archive): the tests that need torchrun are skipped" % found.root
    if not rctx.path(candidate).exists:
        return None, "%s does not exist" % candidate
    result = rctx.execute([candidate, "-c", "import torch; print(torch.__version__)"])
    expected = "%d.%d." % (version[0], version[1])
    if result.return_code != 0 or not result.stdout.startswith(expected):
        return None, "%s cannot import torch %sx (got: %s%s); install the PyTorch of LibTorch %s (tools/bootstrap.sh)" % (
            candidate,
            expected,
            result.stdout.strip(),
            result.stderr.strip()[-200:],
            found.root,
        )
    return candidate, None

def _write_program(rctx, name, interpreter, why_not, args):
    if interpreter:
        rctx.file(name, "#!/bin/sh\nexec %s %s\"$@\"\n" % (interpreter, args), executable = True)
    else:
        rctx.file(name, "%s is unavailable: %s\n" % (name, why_not), executable = False)

def _libtorch_impl(rctx):
    found = find_libtorch(rctx)
    if not found:
        fail("no LibTorch: run tools/bootstrap.sh (PyTorch 2.11.0 into .venv) or set KEEL_LIBTORCH to a folder with include/ and lib/")
    version = _check(rctx, found)
    for name in _HEADER_DIRS:
        rctx.symlink(found.include_dir + "/" + name, "include/" + name)
    has_cuda = rctx.path(found.lib_dir + "/libtorch_cuda.so").exists
    libs = ["libtorch.so", "libtorch_cpu.so", "libc10.so"] + (["libtorch_cuda.so", "libc10_cuda.so"] if has_cuda else [])
    # A wheel's libtorch.so also exports pieces of a newer libstdc++ that its build linked in
    # statically (std::filesystem among them; Keel's calls of remove_all crashed in its copy):
    # libstdc++ is needed first, so that the dynamic linker binds std:: symbols to it.
    linkopts = (["-Wl,--push-state,--no-as-needed", "-lstdc++"] +
                ["%s/%s" % (found.lib_dir, lib) for lib in libs] +
                ["-Wl,--pop-state", "-Wl,-rpath," + found.lib_dir, "-pthread"])

    interpreter, why_not = _python(rctx, found, version)
    _write_program(rctx, "python", interpreter, why_not, "")
    _write_program(rctx, "torchrun", interpreter, why_not, "-m torch.distributed.run ")

    rctx.template("BUILD.bazel", rctx.attr._build_tpl, {
        "%{root}": found.root,
        "%{origin}": found.origin,
        "%{version}": "%d.%d.%d" % version,
        "%{cuda}": "with CUDA" if has_cuda else "CPU only",
        "%{linkopts}": ",\n        ".join(['"%s"' % opt for opt in linkopts]),
        "%{torch_defines}": '"KEEL_LIBTORCH_HAS_CUDA"' if has_cuda else "",
        "%{torch_deps}": '"@local_cuda//:cudart"' if has_cuda else "",
        "%{c10d_defines}": '"USE_C10D_GLOO", "USE_C10D_NCCL"' if has_cuda else '"USE_C10D_GLOO"',
        "%{c10d_deps}": '":torch", "@local_nccl//:nccl_headers"' if has_cuda else '":torch"',
        "%{cuda_constraint}": "" if has_cuda else '"@%s//%s:%s"' % (
            rctx.attr._needs_cuda.workspace_name,
            rctx.attr._needs_cuda.package,
            rctx.attr._needs_cuda.name,
        ),
        "%{cuda_build_check}": "touch $@" if has_cuda else (
            "echo '--config=cuda needs a LibTorch with CUDA; %s (%s) has no lib/libtorch_cuda.so' >&2; exit 1" %
            (found.root.replace("'", ""), found.origin.replace("'", ""))
        ),
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
        "_needs_cuda": attr.label(default = Label("//third_party/cuda:needs_a_libtorch_with_cuda")),
    },
)

def libtorch_repository():
    maybe(_libtorch, name = "libtorch")
