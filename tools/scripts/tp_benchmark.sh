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

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

rounds=3
steps=30
untimed_steps=5
threads=2
train_bin=""
launch_bin=""
work_dir=""
declare -A model=([num_layers]=4 [hidden_size]=256 [num_attention_heads]=8 [ffn_hidden_size]=1024)

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}

for arg in "$@"; do
  case "${arg}" in
    --rounds=*) rounds=${arg#*=} ;;
    --steps=*) steps=${arg#*=} ;;
    --untimed_steps=*) untimed_steps=${arg#*=} ;;
    --threads=*) threads=${arg#*=} ;;
    --train_bin=*) train_bin=${arg#*=} ;;
    --launch_bin=*) launch_bin=${arg#*=} ;;
    --work_dir=*) work_dir=${arg#*=} ;;
    --num_layers=* | --hidden_size=* | --num_attention_heads=* | --ffn_hidden_size=*)
      name=${arg%%=*}
      model[${name#--}]=${arg#*=}
      ;;
    *)
      echo "tp_benchmark: unexpected argument \"${arg}\"" >&2
      usage
      ;;
  esac
done
if ((untimed_steps < 0 || untimed_steps >= steps)); then
  echo "tp_benchmark: --untimed_steps (${untimed_steps}) must be in [0, --steps)" >&2
  exit 2
fi

if [[ -z "${train_bin}" ]]; then
  (cd "${repo_root}" && bazel build --config=opt //tools:train //tools:launch >&2)
  train_bin="${repo_root}/bazel-bin/tools/train"
fi
launch_bin=${launch_bin:-$(dirname "${train_bin}")/launch}
work_dir=${work_dir:-$(mktemp -d -t keel_tp_benchmark.XXXXXX)}
echo "tp_benchmark: work directory ${work_dir}" >&2

per_rank_threads=$((threads / 2 > 0 ? threads / 2 : 1))
common=(--config="${repo_root}/tools/recipe/default.textproto"
  --set "step_scheduler.max_steps=${steps}" --set step_scheduler.global_batch_size=16
  --set step_scheduler.local_batch_size=8 --set step_scheduler.val_every_steps=1000000
  --set step_scheduler.ckpt_every_steps=1000000 --set logging.log_every_steps=1000000
  --set sampler.shuffle_scope=global)
for name in "${!model[@]}"; do common+=(--set "model.${name}=${model[${name}]}"); done

# run NAME ROUND RANKS THREADS [--set ...]: one run into ${work_dir}/NAME.ROUND.
run() {
  local name=$1 round=$2 ranks=$3 run_threads=$4
  shift 4
  local dir="${work_dir}/${name}.${round}"
  local args=("${common[@]}" --set "run_dir=${dir}" "$@")
  if [[ -e "${work_dir}/corpus.bin" ]]; then args+=(--set "data.prefix=${work_dir}/corpus"); fi
  if ((ranks == 1)); then
    OMP_NUM_THREADS=${run_threads} "${train_bin}" "${args[@]}" >"${dir}.log" 2>&1
  else
    OMP_NUM_THREADS=${run_threads} "${launch_bin}" --nproc_per_node="${ranks}" --master_port=0 \
      -- "${train_bin}" "${args[@]}" >"${dir}.log" 2>&1
  fi
  if [[ ! -e "${work_dir}/corpus.bin" ]]; then
    cp "${dir}/data/corpus.bin" "${dir}/data/corpus.idx" "${work_dir}/"
  fi
}

for round in $(seq 1 "${rounds}"); do
  echo "tp_benchmark: round ${round} of ${rounds}" >&2
  run tp1 "${round}" 1 "${threads}"
  run tp2 "${round}" 2 "${per_rank_threads}" --set distributed.tensor_model_parallel_size=2
  run dp2 "${round}" 2 "${per_rank_threads}"
done

python3 - "${work_dir}" "${rounds}" "${untimed_steps}" "${threads}" "${per_rank_threads}" <<'EOF'
import json
import re
import statistics
import sys

work_dir, rounds, untimed, threads, per_rank = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]


def measure(name, round_):
    run = f"{work_dir}/{name}.{round_}"
    metrics = [json.loads(line) for line in open(f"{run}/metrics.jsonl")]
    start = metrics[untimed - 1]["elapsed_seconds"] if untimed > 0 else 0.0
    ms_per_step = 1000.0 * (metrics[-1]["elapsed_seconds"] - start) / (len(metrics) - untimed)
    log = open(f"{run}.log").read()

    def share(pattern):
        found = re.search(pattern + r" ([0-9.eE+-]+)%", log)
        return float(found.group(1)) if found else 0.0

    return {"ms": ms_per_step, "tp": share("tensor-parallel collectives"),
            "wait": share("waiting for gradients"), "loss": metrics[-1]["loss"]}


runs = {(n, r): measure(n, r) for r in range(1, rounds + 1) for n in ("tp1", "tp2", "dp2")}
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
