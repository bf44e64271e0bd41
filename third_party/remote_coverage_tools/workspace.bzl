"""Stub @remote_coverage_tools: Bazel 4.2.3 names it in every test action but downloads it.

Keel does not run `bazel coverage`; the stub targets exist only so test actions resolve
offline. `bazel coverage` would fail loudly on them instead of silently doing nothing.
"""

load("@bazel_tools//tools/build_defs/repo:utils.bzl", "maybe")

_BUILD = """
package(default_visibility = ["//visibility:public"])

[sh_binary(name = name, srcs = ["unsupported.sh"]) for name in ["Main", "lcov_merger", "coverage_report_generator"]]

filegroup(name = "coverage_output_generator", srcs = [])
"""

_SCRIPT = """#!/bin/sh
echo "coverage tools are not available in Keel's offline Bazel setup" >&2
exit 1
"""

def _remote_coverage_tools_impl(rctx):
    rctx.file("BUILD.bazel", _BUILD)
    rctx.file("unsupported.sh", _SCRIPT, executable = True)

_remote_coverage_tools = repository_rule(implementation = _remote_coverage_tools_impl)

def remote_coverage_tools_repository():
    maybe(_remote_coverage_tools, name = "remote_coverage_tools")
