"""@nlohmann_json from Debian's nlohmann-json3-dev (header-only)."""

load("@bazel_tools//tools/build_defs/repo:utils.bzl", "maybe")
load("//third_party:system_repository.bzl", "keel_system_repository")

def nlohmann_json_repository():
    maybe(
        keel_system_repository,
        name = "nlohmann_json",
        build_file = Label("//third_party/nlohmann_json:system.BUILD.bazel"),
    )
