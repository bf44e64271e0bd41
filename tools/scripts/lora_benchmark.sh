#!/usr/bin/env bash
# LoRA beside full fine-tuning of the same model in //tools:train, in one invocation: per
# round, the full run (every parameter trains) and the LoRA run (peft.dim=--rank on every
# '*_proj' layer, the rest frozen) on one rank (--threads threads), alternating, on the same
# data and hyper-parameters. A markdown table on stdout gives, per round and as medians, each
# run's milliseconds per step over the steps after --untimed_steps (from metrics.jsonl's
# elapsed_seconds), its peak resident memory (GNU time's maximum RSS: weights, gradients,
# optimizer state, activations and LibTorch itself) and its final loss.
#
#   tools/scripts/lora_benchmark.sh                              # from the repository root
#   tools/scripts/lora_benchmark.sh --rounds=3 --rank=16 --hidden_size=768
#
# --rank=8 and, as tools/scripts/train_runs.sh reads them, --rounds=3 --steps=30
# --untimed_steps=5 --threads=2, --train_bin, --work_dir; the model is a Llama (model.family
# llama, 2 key-value groups) of --num_layers=4 --hidden_size=256 --num_attention_heads=8
# --ffn_hidden_size=1024 on the default byte corpus. Without --train_bin it builds
# `bazel build --config=opt //tools:train //tools:launch`. Needs GNU time (/usr/bin/time).
set -euo pipefail

bench=lora_benchmark
rank=8
args=()
for arg in "$@"; do
  case "${arg}" in
    --rank=*) rank=${arg#*=} ;;
    *) args+=("${arg}") ;;
  esac
done
set -- "${args[@]+"${args[@]}"}"
source "$(dirname "${BASH_SOURCE[0]}")/train_runs.sh"

llama=(--set model.family=llama --set model.num_query_groups=2)
for round in $(seq 1 "${rounds}"); do
  echo "lora_benchmark: round ${round} of ${rounds}" >&2
  run full "${round}" 1 "${threads}" "${llama[@]}"
  run lora "${round}" 1 "${threads}" "${llama[@]}" --set "peft.dim=${rank}"
done

PYTHONPATH="$(dirname "${BASH_SOURCE[0]}")" python3 - "${work_dir}" "${rounds}" "${untimed_steps}" \
  "${threads}" "${rank}" <<'PY'
import statistics
import sys

from train_runs import measure

work_dir, rounds, untimed, threads, rank = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]

runs = {(n, r): measure(work_dir, n, r, untimed) for r in range(1, rounds + 1) for n in ("full", "lora")}
print(f"| round | full ms/step (1 x {threads} threads) | LoRA r={rank} ms/step | LoRA / full | "
      "full peak RSS MiB | LoRA peak RSS MiB | final loss full / LoRA |")
print("|---|---:|---:|---:|---:|---:|---|")
for r in range(1, rounds + 1):
    a, b = runs[("full", r)], runs[("lora", r)]
    print(f"| {r} | {a['ms']:.1f} | {b['ms']:.1f} | {b['ms'] / a['ms']:.2f} | {a['rss_mib']:.0f} | "
          f"{b['rss_mib']:.0f} | {a['loss']:.4f} / {b['loss']:.4f} |")


def median(name, key):
    return statistics.median(runs[(name, r)][key] for r in range(1, rounds + 1))


print(f"| **median** | **{median('full', 'ms'):.1f}** | **{median('lora', 'ms'):.1f}** | "
      f"**{median('lora', 'ms') / median('full', 'ms'):.2f}** | **{median('full', 'rss_mib'):.0f}** | "
      f"**{median('lora', 'rss_mib'):.0f}** | |")
PY
