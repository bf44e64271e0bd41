#!/usr/bin/env bash
# The pipeline bubble of //tools:train at pipeline_model_parallel_size 2, measured beside
# the theoretical (p - 1) / (m + p - 1) of the 1F1B schedule for m = 4, 8 and 16 micro-batches,
# and the step time at pp=2 beside pp=1, in one invocation: per round, pp=1 on 1 rank
# (--threads threads, 4 micro-batches) and pp=2 on 2 ranks (--threads / 2 threads each, at
# least 1) with 4, 8 and 16 micro-batches of the same 16 x 128 tokens a step, alternating. A
# markdown table on stdout gives, per round and as medians, each run's milliseconds per step
# over the steps after --untimed_steps (from metrics.jsonl's elapsed_seconds), the first
# stage's share of its loop spent waiting for gradients from the last (the trainer's
# "pipeline waits X%": the bubble, plus the transfers), and the final losses (pp=2 computes
# the pp=1 run's numbers, so these agree to rounding).
#
#   tools/scripts/pp_benchmark.sh                              # from the repository root
#   tools/scripts/pp_benchmark.sh --rounds=5 --num_layers=8
#
# Options as tools/scripts/train_runs.sh reads them: --rounds=3 --steps=30 --untimed_steps=5
# --threads=2, the model of --num_layers=4 --hidden_size=256 --num_attention_heads=8
# --ffn_hidden_size=1024; --train_bin, --launch_bin, --work_dir (default a new temporary
# directory, where the logs stay). Without --train_bin it builds `bazel build --config=opt
# //tools:train //tools:launch`.
set -euo pipefail

bench=pp_benchmark
source "$(dirname "${BASH_SOURCE[0]}")/train_runs.sh"

pp2=(--set distributed.pipeline_model_parallel_size=2)
for round in $(seq 1 "${rounds}"); do
  echo "pp_benchmark: round ${round} of ${rounds}" >&2
  run pp1_m4 "${round}" 1 "${threads}" --set step_scheduler.local_batch_size=4
  run pp2_m4 "${round}" 2 "${per_rank_threads}" "${pp2[@]}" --set step_scheduler.local_batch_size=4
  run pp2_m8 "${round}" 2 "${per_rank_threads}" "${pp2[@]}" --set step_scheduler.local_batch_size=2
  run pp2_m16 "${round}" 2 "${per_rank_threads}" "${pp2[@]}" --set step_scheduler.local_batch_size=1
done

PYTHONPATH="$(dirname "${BASH_SOURCE[0]}")" python3 - "${work_dir}" "${rounds}" "${untimed_steps}" \
  "${threads}" "${per_rank_threads}" <<'PY'
import statistics
import sys

from train_runs import measure

work_dir, rounds, untimed, threads, per_rank = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
names = ("pp1_m4", "pp2_m4", "pp2_m8", "pp2_m16")
runs = {(n, r): measure(work_dir, n, r, untimed) for r in range(1, rounds + 1) for n in names}


def theory(m, p=2):
    return 100.0 * (p - 1) / (m + p - 1)


header = f"| round | pp=1 ms/step (1 x {threads} threads, m=4) |"
rule = "|---|---:|"
for m in (4, 8, 16):
    header += f" pp=2 m={m} ms/step (2 x {per_rank}) | bubble m={m} (theory {theory(m):.1f}%) |"
    rule += "---:|---:|"
print(header + " final loss pp=1 / pp=2 m=4 |")
print(rule + "---|")
for r in range(1, rounds + 1):
    row = f"| {r} | {runs[('pp1_m4', r)]['ms']:.1f} |"
    for m in (4, 8, 16):
        run = runs[(f"pp2_m{m}", r)]
        row += f" {run['ms']:.1f} | {run['pp']:.1f}% |"
    print(row + f" {runs[('pp1_m4', r)]['loss']:.4f} / {runs[('pp2_m4', r)]['loss']:.4f} |")


def median(name, key):
    return statistics.median(runs[(name, r)][key] for r in range(1, rounds + 1))


row = f"| **median** | **{median('pp1_m4', 'ms'):.1f}** |"
for m in (4, 8, 16):
    row += f" **{median(f'pp2_m{m}', 'ms'):.1f}** | **{median(f'pp2_m{m}', 'pp'):.1f}%** |"
print(row + " |")
PY
