"""Declares every external repository Keel needs; call keel_dependencies() from a WORKSPACE.

Each repository is declared only if the calling workspace has not declared it already, so a
consumer's own copy of a dependency wins. Nothing here downloads: the repositories map
Debian's system packages (see tools/bootstrap.sh) and local toolkits into Bazel targets.
"""

load("//third_party/absl:workspace.bzl", "absl_repository")
load("//third_party/benchmark:workspace.bzl", "benchmark_repository")
load("//third_party/cuda:workspace.bzl", "cuda_repository")
load("//third_party/googletest:workspace.bzl", "googletest_repository")
load("//third_party/libtorch:workspace.bzl", "libtorch_repository")
load("//third_party/nccl:workspace.bzl", "nccl_repository")
load("//third_party/nlohmann_json:workspace.bzl", "nlohmann_json_repository")
load("//third_party/protobuf:workspace.bzl", "protobuf_repository")
load("//third_party/remote_coverage_tools:workspace.bzl", "remote_coverage_tools_repository")
load("//third_party/rules_cc:workspace.bzl", "rules_cc_repository")
load("//third_party/rules_java:workspace.bzl", "rules_java_repository")
load("//third_party/sentencepiece:workspace.bzl", "sentencepiece_repository")
load("//third_party/xxhash:workspace.bzl", "xxhash_repository")

def keel_dependencies():
    """Declares Keel's external repositories (offline shims, system libraries, LibTorch, CUDA)."""
    rules_cc_repository()
    rules_java_repository()
    remote_coverage_tools_repository()
    absl_repository()
    protobuf_repository()
    googletest_repository()
    benchmark_repository()
    nlohmann_json_repository()
    sentencepiece_repository()
    xxhash_repository()
    libtorch_repository()
    cuda_repository()
    nccl_repository()
