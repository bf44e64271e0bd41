"""@rules_java from Debian's bazel-rules-java package (Bazel 4.2.3 asks for it even for C++ builds).

Read from /usr/share/bazel/rules/java, under $KEEL_SYSROOT when that is set (tools/device/).
"""

load("@bazel_tools//tools/build_defs/repo:utils.bzl", "maybe")

def _rules_java_impl(rctx):
    root = rctx.os.environ.get("KEEL_SYSROOT", "") + "/usr/share/bazel/rules/java"
    if not rctx.path(root + "/WORKSPACE").exists:
        fail("%s is missing; run tools/bootstrap.sh" % root)
    for entry in rctx.path(root).readdir():
        rctx.symlink(entry, entry.basename)

_rules_java = repository_rule(
    implementation = _rules_java_impl,
    environ = ["KEEL_SYSROOT"],
    local = True,
)

def rules_java_repository():
    maybe(_rules_java, name = "rules_java")
