#!/usr/bin/env bash
# Step time of //tools:train with tensor parallelism against the same run without it, in one
# invocation: per round, tp=1 on 1 rank (--threads threads), tp=2 on 2 ranks and dp=2 on 2
# ranks (the other way to use 2 processes; --threads / 2 threads each, at least 1), alternating,
# on the same data, model and hyper-parameters. A markdown table on stdout gives, per round and
# as medians, each run's milliseconds per step over the steps after --untimed_steps (from
# metrics.jsonl's elapsed_seconds), the share of its loop spent in the tensor-parallel
# collectives (the trainer's "tensor-parallel collectives X%") and waiting for the
# data-parallel gradients ("waiting for gradients X%"), and its final loss (tp=2 computes the
# tp=1 run's numbers, so these agree to rounding).
#
#   tools/scripts/tp_benchmark.sh                              # from the repository root
#   tools/scripts/tp_benchmark.sh --rounds=5 --hidden_size=512 --ffn_hidden_size=2048
#
# --rounds=3 --steps=30 --untimed_steps=5 --threads=2 by default, the model of
# --num_layers=4 --hidden_size=256 --num_attention_heads=8 --ffn_hidden_size=1024 over
# 16 x 128 tokens a step in micro-batches of 8 (tp=1 and tp=2: 2 micro-batches; dp=2: 1 per
# rank). Without --train_bin it builds `bazel build --config=opt //tools:train //tools:launch`
# (--launch_bin: default beside the trainer). The trainer prepares its default corpus once in
# the work directory (--work_dir, default a new temporary directory; logs stay there).
set -euo pipefail

bench=tp_benchmark
source "$(dirname "${BASH_SOURCE[0]}")/train_runs.sh"

for round in $(seq 1 "${rounds}"); do
  echo "tp_benchmark: round ${round} of ${rounds}" >&2
  run tp1 "${round}" 1 "${threads}"
  run tp2 "${round}" 2 "${per_rank_threads}" --set distributed.tensor_model_parallel_size=2
  run dp2 "${round}" 2 "${per_rank_threads}"
done

PYTHONPATH="$(dirname "${BASH_SOURCE[0]}")" python3 - "${work_dir}" "${rounds}" "${untimed_steps}" \
  "${threads}" "${per_rank_threads}" <<'EOF'
import statistics
import sys

from train_runs import measure

work_dir, rounds, untimed, threads, per_rank = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]

runs = {(n, r): measure(work_dir, n, r, untimed) for r in range(1, rounds + 1) for n in ("tp1", "tp2", "dp2")}
print(f"| round | tp=1 ms/step (1 x {threads} threads) | tp=2 ms/step (2 x {per_rank}) | "
      f"tp=2 / tp=1 | tp=2 in TP collectives | dp=2 ms/step (2 x {per_rank}) | "
      "dp=2 waiting for gradients | final loss tp=1 / tp=2 |")
print("|---|---:|---:|---:|---:|---:|---:|---|")
for r in range(1, rounds + 1):
    a, b, c = runs[("tp1", r)], runs[("tp2", r)], runs[("dp2", r)]
    print(f"| {r} | {a['ms']:.1f} | {b['ms']:.1f} | {b['ms'] / a['ms']:.2f} | {b['tp']:.1f}% | "
          f"{c['ms']:.1f} | {c['wait']:.1f}% | {a['loss']:.4f} / {b['loss']:.4f} |")


def median(name, key):
    return statistics.median(runs[(name, r)][key] for r in range(1, rounds + 1))


print(f"| **median** | **{median('tp1', 'ms'):.1f}** | **{median('tp2', 'ms'):.1f}** | "
      f"**{median('tp2', 'ms') / median('tp1', 'ms'):.2f}** | **{median('tp2', 'tp'):.1f}%** | "
      f"**{median('dp2', 'ms'):.1f}** | **{median('dp2', 'wait'):.1f}%** | |")
EOF
