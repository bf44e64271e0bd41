"""@rules_cc without a download: Bazel 4.2.3 still has the C++ rules built in.

Keel's BUILD files load @rules_cc//cc:defs.bzl as upstream recommends, so moving to the real
rules_cc later touches only this folder.
"""

load("@bazel_tools//tools/build_defs/repo:utils.bzl", "maybe")

def _rules_cc_impl(rctx):
    rctx.file("WORKSPACE", 'workspace(name = "rules_cc")\n')
    rctx.file("BUILD.bazel", "")
    rctx.file("cc/BUILD.bazel", "\n".join([
        'exports_files(["defs.bzl"])',
        'alias(name = "toolchain_type", actual = "@bazel_tools//tools/cpp:toolchain_type", visibility = ["//visibility:public"])',
        "",
    ]))
    rctx.symlink(rctx.attr.defs, "cc/defs.bzl")

_rules_cc = repository_rule(
    implementation = _rules_cc_impl,
    attrs = {"defs": attr.label(default = Label("//third_party/rules_cc:defs.bzl"), allow_single_file = True)},
)

def rules_cc_repository():
    maybe(_rules_cc, name = "rules_cc")
