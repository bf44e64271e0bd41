"""@com_google_absl from Debian's libabsl-dev, under upstream label paths."""

load("@bazel_tools//tools/build_defs/repo:utils.bzl", "maybe")
load("//third_party:system_repository.bzl", "keel_system_repository")

_TARGETS = [
    "absl/base:core_headers",
    "absl/cleanup:cleanup",
    "absl/container:btree",
    "absl/container:flat_hash_map",
    "absl/container:flat_hash_set",
    "absl/container:inlined_vector",
    "absl/flags:declare",
    "absl/flags:flag",
    "absl/flags:parse",
    "absl/flags:usage",
    "absl/functional:function_ref",
    "absl/hash:hash",
    "absl/status:status",
    "absl/status:statusor",
    "absl/strings:cord",
    "absl/strings:str_format",
    "absl/strings:strings",
    "absl/synchronization:synchronization",
    "absl/time:time",
    "absl/types:optional",
    "absl/types:span",
    "absl/types:variant",
]

def absl_repository():
    maybe(
        keel_system_repository,
        name = "com_google_absl",
        build_file = Label("//third_party/absl:system.BUILD.bazel"),
        aliases = {target: "//:absl" for target in _TARGETS},
    )
