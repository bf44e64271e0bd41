"""@sentencepiece from Debian's libsentencepiece-dev (headers in /usr/include, -lsentencepiece)."""

load("@bazel_tools//tools/build_defs/repo:utils.bzl", "maybe")
load("//third_party:system_repository.bzl", "keel_system_repository")

def sentencepiece_repository():
    maybe(
        keel_system_repository,
        name = "sentencepiece",
        build_file = Label("//third_party/sentencepiece:system.BUILD.bazel"),
    )
