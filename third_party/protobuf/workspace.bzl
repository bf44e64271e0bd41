"""@com_google_protobuf from Debian's libprotobuf-dev and protobuf-compiler."""

load("@bazel_tools//tools/build_defs/repo:utils.bzl", "maybe")
load("//third_party:system_repository.bzl", "keel_system_repository")

def protobuf_repository():
    maybe(
        keel_system_repository,
        name = "com_google_protobuf",
        build_file = Label("//third_party/protobuf:system.BUILD.bazel"),
        # Upstream protobuf's load path for proto_library, forwarding to Bazel 4.2.3's native rule.
        files = {
            "bazel/BUILD.bazel": "",
            "bazel/proto_library.bzl": "proto_library = native.proto_library\n",
        },
        symlinks = {
            "/usr/bin/protoc": "bin/protoc",
            "/usr/include/google/protobuf": "google/protobuf",
        },
    )
