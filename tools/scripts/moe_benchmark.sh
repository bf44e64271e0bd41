#!/usr/bin/env bash
# A mixture-of-experts GPT of //tools:train beside a dense one with the same active
# parameters, in one invocation: per round, on 2 ranks (--threads / 2 threads each, at least 1),
# the dense model (MLP of 2 x --ffn_hidden_size) data-parallel, the MoE model (4 experts of
# --ffn_hidden_size, 2 per token, the load-balancing loss at 0.01) data-parallel (every rank
# holds every expert), and the MoE model with expert_model_parallel_size 2 (2 experts a rank,
# tokens exchanged by all-to-all), alternating, on the same data and hyper-parameters. A
# markdown table on stdout gives, per round and as medians, each run's milliseconds per step
# and tokens per second over the steps after --untimed_steps (from metrics.jsonl), and the
# share of the loop spent in the experts' all-to-alls (the trainer's "expert dispatch X%").
#
#   tools/scripts/moe_benchmark.sh                              # from the repository root
#
# Options as tools/scripts/train_runs.sh reads them: --rounds=3 --steps=30 --untimed_steps=5
# --threads=2, the model of --num_layers=4 --hidden_size=256 --num_attention_heads=8
# --ffn_hidden_size=1024; --train_bin, --launch_bin, --work_dir. Without --train_bin it builds
# `bazel build --config=opt //tools:train //tools:launch`.
set -euo pipefail

bench=moe_benchmark
source "$(dirname "${BASH_SOURCE[0]}")/train_runs.sh"

ffn=${model[ffn_hidden_size]}
moe=(--set model.num_moe_experts=4 --set model.moe_router_topk=2
  --set model.moe_aux_loss_coeff=0.01)
for round in $(seq 1 "${rounds}"); do
  echo "moe_benchmark: round ${round} of ${rounds}" >&2
  run dense "${round}" 2 "${per_rank_threads}" --set "model.ffn_hidden_size=$((2 * ffn))"
  run moe_dp "${round}" 2 "${per_rank_threads}" "${moe[@]}"
  run moe_ep2 "${round}" 2 "${per_rank_threads}" "${moe[@]}" \
    --set distributed.expert_model_parallel_size=2
done

PYTHONPATH="$(dirname "${BASH_SOURCE[0]}")" python3 - "${work_dir}" "${rounds}" "${untimed_steps}" \
  "${per_rank_threads}" <<'PY'
import re
import statistics
import sys

from train_runs import measure

work_dir, rounds, untimed, per_rank = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
names = ("dense", "moe_dp", "moe_ep2")
tokens_per_step = 16 * 128
runs = {}
for r in range(1, rounds + 1):
    for n in names:
        run = measure(work_dir, n, r, untimed)
        found = re.search(r"expert dispatch ([0-9.eE+-]+)%", open(f"{work_dir}/{n}.{r}.log").read())
        run["dispatch"] = float(found.group(1)) if found else 0.0
        runs[(n, r)] = run

print(f"| round | dense ms/step (2 x {per_rank}) | dense tokens/s | MoE dp=2 ms/step | MoE dp=2 "
      "tokens/s | MoE ep=2 ms/step | MoE ep=2 tokens/s | ep=2 in expert all-to-alls |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")


def row(label, value):
    cells = []
    for n in names:
        ms = value(n, "ms")
        cells += [f"{ms:.1f}", f"{1000.0 * tokens_per_step / ms:.0f}"]
    return f"| {label} | " + " | ".join(cells) + f" | {value('moe_ep2', 'dispatch'):.1f}% |"


for r in range(1, rounds + 1):
    print(row(str(r), lambda n, k: runs[(n, r)][k]))
print(row("**median**", lambda n, k: statistics.median(runs[(n, r)][k] for r in range(1, rounds + 1))))
PY
