#!/usr/bin/env bash
# Packed against padded conversations in //tools:train (data.format sft), in one invocation: per
# round, the padded run (one conversation a row, padded to --sequence_length) and the packed
# run (packed_sequence.packed_sequence_size=--sequence_length: conversations packed whole, in
# order, attending within themselves) on one rank (--threads threads), alternating, on the same
# conversations of skewed lengths and the same model, rows and steps. A markdown table on stdout
# gives, per round and as medians, each run's learned tokens (the answers' labels, the loss's
# tokens) per second and its milliseconds per step, over the steps after --untimed_steps
# (metrics.jsonl's tokens_per_second and elapsed_seconds).
#
#   tools/scripts/packing_benchmark.sh                          # from the repository root
#   tools/scripts/packing_benchmark.sh --rounds=3 --sequence_length=1024
#
# The data: --conversations=4000 conversations of random bytes whose lengths are log-normal
# (median --median_length=48 tokens, sigma 0.9, cut to 4 .. --sequence_length + 1), the first
# third of each a prompt that is not learned, written with tools/scripts/megatron_indexed.py
# (the format tools/scripts/hf_sft_tokenize.py writes) into the work directory.
# --sequence_length=512 and, as tools/scripts/train_runs.sh reads them, --rounds=3 --steps=30
# --untimed_steps=5 --threads=2, --train_bin, --work_dir; the model is a Llama (model.family
# llama, 2 key-value groups) of --num_layers=4 --hidden_size=256 --num_attention_heads=8
# --ffn_hidden_size=1024. Without --train_bin it builds `bazel build --config=opt //tools:train
# //tools:launch`. Needs the repository's Python (.venv, tools/bootstrap.sh) for numpy.
set -euo pipefail

bench=packing_benchmark
sequence_length=512
conversations=4000
median_length=48
args=()
for arg in "$@"; do
  case "${arg}" in
    --sequence_length=*) sequence_length=${arg#*=} ;;
    --conversations=*) conversations=${arg#*=} ;;
    --median_length=*) median_length=${arg#*=} ;;
    *) args+=("${arg}") ;;
  esac
done
set -- "${args[@]+"${args[@]}"}"
source "$(dirname "${BASH_SOURCE[0]}")/train_runs.sh"

# The conversations, as ${work_dir}/corpus: train_runs.sh's `run` trains on that prefix.
PYTHONPATH="$(dirname "${BASH_SOURCE[0]}")" "${repo_root}/.venv/bin/python" - "${work_dir}/corpus" \
  "${conversations}" "${median_length}" "${sequence_length}" <<'PY'
import sys

import numpy as np

import megatron_indexed

prefix, count, median, longest = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]) + 1
generator = np.random.default_rng(44)
lengths = np.clip(np.rint(median * np.exp(0.9 * generator.standard_normal(count))), 4, longest).astype(int)
tokens = megatron_indexed.Writer(prefix, np.uint16)
masks = megatron_indexed.Writer(prefix + "_loss_mask", np.uint8)
for n in lengths:
    tokens.add_document([generator.integers(0, 256, n).tolist()])
    masks.add_document([[0] * (n // 3) + [1] * (n - n // 3)])
tokens.finish(None)
masks.finish(None)
print(f"packing_benchmark: {count} conversations, {lengths.sum()} tokens, lengths median "
      f"{int(np.median(lengths))}, mean {lengths.mean():.1f}, max {lengths.max()}", file=sys.stderr)
PY

sft=(--set model.family=llama --set model.num_query_groups=2 --set data.format=sft
  --set data.overlong=truncate --set data.validation_every_n_samples=0
  --set "data.sequence_length=${sequence_length}" --set logging.log_every_steps=1)
for round in $(seq 1 "${rounds}"); do
  echo "packing_benchmark: round ${round} of ${rounds}" >&2
  run padded "${round}" 1 "${threads}" "${sft[@]}"
  run packed "${round}" 1 "${threads}" "${sft[@]}" \
    --set "packed_sequence.packed_sequence_size=${sequence_length}"
done

python3 - "${work_dir}" "${rounds}" "${untimed_steps}" "${threads}" "${sequence_length}" <<'PY'
import json
import statistics
import sys

work_dir, rounds, untimed, threads, length = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]


def measure(name, round_):
    """Learned tokens per second and ms per step over the steps after `untimed`."""
    metrics = [json.loads(line) for line in open(f"{work_dir}/{name}.{round_}/metrics.jsonl")]
    learned, seconds, previous = 0.0, 0.0, metrics[untimed - 1]["elapsed_seconds"] if untimed else 0.0
    for m in metrics[untimed:]:
        dt = m["elapsed_seconds"] - previous
        learned += m["tokens_per_second"] * dt  # one step's label tokens: each step logs
        seconds += dt
        previous = m["elapsed_seconds"]
    return {"tokens_per_s": learned / seconds, "ms": 1000.0 * seconds / (len(metrics) - untimed),
            "loss": metrics[-1]["loss"]}


runs = {(n, r): measure(n, r) for r in range(1, rounds + 1) for n in ("padded", "packed")}
print(f"| round | padded learned tok/s (1 x {threads} threads) | packed learned tok/s | packed / padded | "
      f"padded ms/step | packed ms/step | final loss padded / packed |")
print("|---|---:|---:|---:|---:|---:|---|")
for r in range(1, rounds + 1):
    a, b = runs[("padded", r)], runs[("packed", r)]
    print(f"| {r} | {a['tokens_per_s']:.0f} | {b['tokens_per_s']:.0f} | {b['tokens_per_s'] / a['tokens_per_s']:.2f} | "
          f"{a['ms']:.0f} | {b['ms']:.0f} | {a['loss']:.4f} / {b['loss']:.4f} |")


def median(name, key):
    return statistics.median(runs[(name, r)][key] for r in range(1, rounds + 1))


print(f"| **median** | **{median('padded', 'tokens_per_s'):.0f}** | **{median('packed', 'tokens_per_s'):.0f}** | "
      f"**{median('packed', 'tokens_per_s') / median('padded', 'tokens_per_s'):.2f}** | "
      f"**{median('padded', 'ms'):.0f}** | **{median('packed', 'ms'):.0f}** | |")
PY
