"""A repository rule that maps a system-installed library onto upstream-style Bazel labels.

The root BUILD file comes from `build_file`; `aliases` adds packages so that upstream label
paths such as `@com_google_absl//absl/status:statusor` resolve to targets of that root file;
`symlinks` brings the few system files a rule must see as inputs (protoc, .proto sources);
`files` writes small shims such as a .bzl that forwards to a native rule; `programs` brings
command-line tools that only some tests run: a missing one becomes a text file saying which
package brings it (the tests skip, naming it), not a failed build.
Nothing is downloaded: headers come from the compiler's default include path (/usr/include)
and libraries from the linker's default path, as installed by tools/bootstrap.sh.
With $KEEL_SYSROOT set, `symlinks` are read under it instead, and the C++ toolchain gets the
sysroot's include and library folders from BAZEL_CXXOPTS and BAZEL_LINKOPTS (tools/device/).
"""

def _system_repository_impl(rctx):
    sysroot = rctx.os.environ.get("KEEL_SYSROOT", "")
    rctx.symlink(rctx.attr.build_file, "BUILD.bazel")
    for system_path, repo_path in rctx.attr.symlinks.items():
        if not rctx.path(sysroot + system_path).exists:
            fail("%s: %s is missing; run tools/bootstrap.sh" % (rctx.name, sysroot + system_path))
        rctx.symlink(sysroot + system_path, repo_path)
    for repo_path, content in rctx.attr.files.items():
        rctx.file(repo_path, content)
    for system_path, repo_path in rctx.attr.programs.items():
        if rctx.path(sysroot + system_path).exists:
            rctx.symlink(sysroot + system_path, repo_path)
        else:
            rctx.file(repo_path, "%s is unavailable: %s is not installed (%s; tools/bootstrap.sh installs it)\n" % (
                repo_path,
                sysroot + system_path,
                rctx.attr.programs_package,
            ), executable = False)
    packages = {}
    for label, actual in rctx.attr.aliases.items():
        package, name = label.split(":")
        packages.setdefault(package, []).append((name, actual))
    for package, targets in packages.items():
        lines = ['package(default_visibility = ["//visibility:public"])', ""]
        for name, actual in sorted(targets):
            lines.append('alias(name = "%s", actual = "%s")' % (name, actual))
        rctx.file(package + "/BUILD.bazel", "\n".join(lines) + "\n")

keel_system_repository = repository_rule(
    implementation = _system_repository_impl,
    attrs = {
        "build_file": attr.label(mandatory = True, allow_single_file = True),
        "aliases": attr.string_dict(doc = "upstream 'package:target' -> label in the root BUILD file"),
        "symlinks": attr.string_dict(doc = "absolute system path -> path inside the repository"),
        "files": attr.string_dict(doc = "path inside the repository -> content (small shims)"),
        "programs": attr.string_dict(doc = "absolute path of a program -> path inside the repository"),
        "programs_package": attr.string(doc = "the Debian package that brings `programs`"),
    },
    environ = ["KEEL_SYSROOT"],
    local = True,
)
