"""@sentencepiece from Debian's libsentencepiece-dev (headers in /usr/include, -lsentencepiece),
and the spm_train and spm_encode tools of Debian's sentencepiece, which tests run."""

load("@bazel_tools//tools/build_defs/repo:utils.bzl", "maybe")
load("//third_party:system_repository.bzl", "keel_system_repository")

def sentencepiece_repository():
    maybe(
        keel_system_repository,
        name = "sentencepiece",
        build_file = Label("//third_party/sentencepiece:system.BUILD.bazel"),
        programs = {
            "/usr/bin/spm_encode": "spm_encode",
            "/usr/bin/spm_train": "spm_train",
        },
        programs_package = "Debian's sentencepiece",
    )
