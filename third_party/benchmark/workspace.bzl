"""@com_github_google_benchmark from Debian's libbenchmark-dev."""

load("@bazel_tools//tools/build_defs/repo:utils.bzl", "maybe")
load("//third_party:system_repository.bzl", "keel_system_repository")

def benchmark_repository():
    maybe(
        keel_system_repository,
        name = "com_github_google_benchmark",
        build_file = Label("//third_party/benchmark:system.BUILD.bazel"),
    )
