"""@com_google_googletest from Debian's libgtest-dev and libgmock-dev."""

load("@bazel_tools//tools/build_defs/repo:utils.bzl", "maybe")
load("//third_party:system_repository.bzl", "keel_system_repository")

def googletest_repository():
    maybe(
        keel_system_repository,
        name = "com_google_googletest",
        build_file = Label("//third_party/googletest:system.BUILD.bazel"),
    )
