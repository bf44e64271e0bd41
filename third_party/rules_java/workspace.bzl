"""@rules_java from Debian's bazel-rules-java package (Bazel 4.2.3 asks for it even for C++ builds)."""

load("@bazel_tools//tools/build_defs/repo:utils.bzl", "maybe")

def rules_java_repository():
    maybe(native.local_repository, name = "rules_java", path = "/usr/share/bazel/rules/java")
