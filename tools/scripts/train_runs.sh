# Sourced by the model-parallel benchmarks (tp_benchmark.sh, pp_benchmark.sh), after they set
# `bench` (their name): reads the options they share (an unknown one prints the script's
# header comment and exits 2), builds the trainer unless --train_bin is given, and defines
# `run`, one trainer run into the work directory. Options: --rounds=3 --steps=30 --untimed_steps=5 --threads=2 --train_bin
# --launch_bin --work_dir, and the model's --num_layers=4 --hidden_size=256
# --num_attention_heads=8 --ffn_hidden_size=1024.

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

# The running script's header comment, to stderr; exit 2.
usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}
rounds=3
steps=30
untimed_steps=5
threads=2
train_bin=""
launch_bin=""
work_dir=""
declare -A model=([num_layers]=4 [hidden_size]=256 [num_attention_heads]=8 [ffn_hidden_size]=1024)

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
      echo "${bench}: unexpected argument \"${arg}\"" >&2
      usage
      ;;
  esac
done
if ((untimed_steps < 0 || untimed_steps >= steps)); then
  echo "${bench}: --untimed_steps (${untimed_steps}) must be in [0, --steps)" >&2
  exit 2
fi

if [[ -z "${train_bin}" ]]; then
  (cd "${repo_root}" && bazel build --config=opt //tools:train //tools:launch >&2)
  train_bin="${repo_root}/bazel-bin/tools/train"
fi
launch_bin=${launch_bin:-$(dirname "${train_bin}")/launch}
work_dir=${work_dir:-$(mktemp -d -t "keel_${bench}.XXXXXX")}
mkdir -p "${work_dir}"
echo "${bench}: work directory ${work_dir}" >&2

per_rank_threads=$((threads / 2 > 0 ? threads / 2 : 1))
common=(--config="${repo_root}/tools/recipe/default.textproto"
  --set "step_scheduler.max_steps=${steps}" --set step_scheduler.global_batch_size=16
  --set step_scheduler.local_batch_size=8 --set step_scheduler.val_every_steps=1000000
  --set step_scheduler.ckpt_every_steps=1000000 --set logging.log_every_steps=1000000
  --set sampler.shuffle_scope=global)
for name in "${!model[@]}"; do common+=(--set "model.${name}=${model[${name}]}"); done

# timed FILE COMMAND...: COMMAND, its peak resident memory in KiB (GNU time's, the largest
# process's) in FILE; 0 there on a machine without GNU time (as some GPU machines are).
timed() {
  local out=$1
  shift
  if [[ -x /usr/bin/time ]]; then
    /usr/bin/time -f %M -o "${out}" "$@"
  else
    echo 0 >"${out}"
    "$@"
  fi
}

# run NAME ROUND RANKS THREADS [--set ...]: one run into ${work_dir}/NAME.ROUND (its log beside
# it, and its peak resident memory in KiB in NAME.ROUND.rss: the trainer's, or over several
# ranks the largest rank's; see timed), on the corpus the first run prepared.
run() {
  local name=$1 round=$2 ranks=$3 run_threads=$4
  shift 4
  local dir="${work_dir}/${name}.${round}"
  local args=("${common[@]}" --set "run_dir=${dir}" "$@")
  if [[ -e "${work_dir}/corpus.bin" ]]; then args+=(--set "data.prefix=${work_dir}/corpus"); fi
  if ((ranks == 1)); then
    OMP_NUM_THREADS=${run_threads} timed "${dir}.rss" "${train_bin}" "${args[@]}" >"${dir}.log" 2>&1
  else
    OMP_NUM_THREADS=${run_threads} timed "${dir}.rss" "${launch_bin}" \
      --nproc_per_node="${ranks}" --master_port=0 -- "${train_bin}" "${args[@]}" >"${dir}.log" 2>&1
  fi
  if [[ ! -e "${work_dir}/corpus.bin" ]]; then
    cp "${dir}/data/corpus.bin" "${dir}/data/corpus.idx" "${work_dir}/"
  fi
}
