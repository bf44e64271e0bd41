"""@xxhash from Debian's libxxhash-dev (header in /usr/include, -lxxhash)."""

load("@bazel_tools//tools/build_defs/repo:utils.bzl", "maybe")
load("//third_party:system_repository.bzl", "keel_system_repository")

def xxhash_repository():
    maybe(
        keel_system_repository,
        name = "xxhash",
        build_file = Label("//third_party/xxhash:system.BUILD.bazel"),
    )
