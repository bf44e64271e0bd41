#!/usr/bin/env bash
# Training throughput of //tools:train against tools/scripts/train_reference.py, the same loop in
# Python, with the PyTorch whose LibTorch the trainer is built against (@libtorch//:python), on
# the same data, model, hyper-parameters, seed and device. The runs alternate (C++, Python, C++, Python,
# ...) in one invocation with the same thread count, and a markdown table on stdout gives, per
# round and as medians: label tokens per second of each over the steps after --untimed_steps,
# their ratio, the final loss of each (both start from the same weights and see the same
# batches, so these agree up to rounding), and the share of the trainer's loop spent in Keel's
# bookkeeping (step scheduler, sampler, LR schedule; its "bookkeeping X% of Y s" line).
# With --ranks=N (N > 1) both are data-parallel on N processes: the trainer on tools:launch,
# the Python loop in DistributedDataParallel (Gloo) on torchrun (python3 -m
# torch.distributed.run), --threads threads each; tokens/s are then per rank, and the table
# adds each one's share of the loop spent waiting for gradients after backward (the trainer's
# "waiting for gradients X%", the reference's gradient_wait_share from DDP's comm hook).
#
#   tools/scripts/train_benchmark.sh                                   # from the repository root
#   tools/scripts/train_benchmark.sh --rounds=5 --threads=4 --hidden_size=256 --ffn_hidden_size=1024
#   tools/scripts/train_benchmark.sh --train_bin=bazel-bin/tools/train --prefix=runs/default/data/corpus
#   tools/scripts/train_benchmark.sh --ranks=2 --threads=1 --local_batch_size=4
#   tools/scripts/train_benchmark.sh --device=cuda        # the trainer on NCCL, the reference on CUDA
#   tools/scripts/train_benchmark.sh --device=cuda --reference_flag=--bf16 --trainer_set=model.tf32=true
#
# --family=llama trains the Llama family instead of the GPT: the reference as transformers'
# LlamaForCausalLM, whose initial weights it writes once into the work directory, and the
# trainer from that Hugging Face directory (model.pretrained_path), so both start from the same
# weights; --num_query_groups=N gives it N key-value heads (default: one per query head).
# --trainer_set=FIELD=VALUE (repeatable) sets a field of the trainer only, --reference_flag=FLAG
# (repeatable) passes a flag to the reference only (a variant: --bf16, --compile, --fused,
# --tf32); --json=FILE also writes the medians and the model's size as JSON
# (tools/scripts/gpu_benchmark.sh reads it).
# --rounds=3 --steps=40 --untimed_steps=5 --threads=2 (the default run's 2 cores) --ranks=1
# --device=cpu --wait_policy=PASSIVE (OMP_WAIT_POLICY, the trainer's default) by default;
# any hyper-parameter below can be set the same way (--name=value, both loops get it).
# Without --train_bin it builds `bazel build --config=opt //tools:train //tools:launch` (with
# --train_bin, --launch_bin names the launcher, default beside the trainer); without --python,
# @libtorch//:python (bazel build); without --prefix the
# trainer prepares its default corpus (/usr/share/common-licenses) once in the work directory
# (--work_dir, default a new temporary directory; run logs and metrics stay there).
# Validation and periodic checkpoints are off; the trainer still checkpoints after its last
# step, outside the timed steps. C++ tokens/s come from <run_dir>/metrics.jsonl
# (elapsed_seconds), Python's from its tokens_per_second line: the same definition.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

rounds=3
steps=40
untimed_steps=5
threads=2
ranks=1
# OpenMP wait policy for both (the trainer defaults to PASSIVE; libgomp to spinning).
wait_policy=PASSIVE
python=""  # the Python of the LibTorch Bazel builds against
device=cpu
train_bin=""
launch_bin=""
prefix=""
work_dir=""
json_out=""
family=gpt
num_query_groups=0
trainer_extra=()
reference_extra=()

# The hyper-parameters both loops get: reference flag, trainer field, value
# (tools/recipe/default.textproto's values).
hyper_parameters=(
  "seed                       seed                               1234"
  "global_batch_size          step_scheduler.global_batch_size   16"
  "local_batch_size           step_scheduler.local_batch_size    8"
  "sequence_length            data.sequence_length               128"
  "validation_every_n_samples data.validation_every_n_samples    20"
  "vocab_size                 model.vocab_size                   256"
  "hidden_size                model.hidden_size                  128"
  "num_layers                 model.num_layers                   4"
  "num_attention_heads        model.num_attention_heads          4"
  "ffn_hidden_size            model.ffn_hidden_size              512"
  "lr                         optimizer.lr                       0.003"
  "beta1                      optimizer.beta1                    0.9"
  "beta2                      optimizer.beta2                    0.95"
  "eps                        optimizer.eps                      1e-8"
  "weight_decay               optimizer.weight_decay             0.01"
  "init_lr                    lr_scheduler.init_lr               0.0"
  "max_lr                     lr_scheduler.max_lr                0.003"
  "min_lr                     lr_scheduler.min_lr                0.0003"
  "lr_warmup_steps            lr_scheduler.lr_warmup_steps       20"
  "lr_decay_steps             lr_scheduler.lr_decay_steps        200"
  "lr_decay_style             lr_scheduler.lr_decay_style        cosine"
  "start_wd                   lr_scheduler.start_wd              0.01"
  "end_wd                     lr_scheduler.end_wd                0.01"
  "wd_incr_style              lr_scheduler.wd_incr_style         constant"
  "max_norm                   clip_grad.max_norm                 1.0"
)
declare -A value=()
declare -A field=()
flag_names=()
for row in "${hyper_parameters[@]}"; do
  read -r name trainer_field default <<<"${row}"
  value[${name}]=${default}
  field[${name}]=${trainer_field}
  flag_names+=("${name}")
done

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
  echo "hyper-parameters: ${flag_names[*]}" >&2
  exit 2
}

for arg in "$@"; do
  case "${arg}" in
    --rounds=*) rounds=${arg#*=} ;;
    --steps=*) steps=${arg#*=} ;;
    --untimed_steps=*) untimed_steps=${arg#*=} ;;
    --threads=*) threads=${arg#*=} ;;
    --ranks=*) ranks=${arg#*=} ;;
    --device=*) device=${arg#*=} ;;
    --launch_bin=*) launch_bin=${arg#*=} ;;
    --wait_policy=*) wait_policy=${arg#*=} ;;
    --python=*) python=${arg#*=} ;;
    --train_bin=*) train_bin=${arg#*=} ;;
    --prefix=*) prefix=${arg#*=} ;;
    --work_dir=*) work_dir=${arg#*=} ;;
    --json=*) json_out=${arg#*=} ;;
    --family=*) family=${arg#*=} ;;
    --num_query_groups=*) num_query_groups=${arg#*=} ;;
    --trainer_set=*) trainer_extra+=(--set "${arg#*=}") ;;
    --reference_flag=*) reference_extra+=("${arg#*=}") ;;
    -h | --help) usage ;;
    --*=*)
      name=${arg%%=*}
      name=${name#--}
      if [[ -z "${field[${name}]+set}" ]]; then
        echo "train_benchmark: unknown flag ${arg%%=*}" >&2
        usage
      fi
      value[${name}]=${arg#*=}
      ;;
    *)
      echo "train_benchmark: unexpected argument \"${arg}\"" >&2
      usage
      ;;
  esac
done
for n in rounds steps threads ranks; do
  if ! [[ "${!n}" =~ ^[1-9][0-9]*$ ]]; then
    echo "train_benchmark: --${n} (${!n}) must be a positive integer" >&2
    exit 2
  fi
done
if [[ "${family}" != gpt && "${family}" != llama ]]; then
  echo "train_benchmark: --family (${family}) must be gpt or llama" >&2
  exit 2
fi
if ! [[ "${num_query_groups}" =~ ^[0-9]+$ ]] || { [[ "${family}" == gpt ]] && ((num_query_groups > 0)); }; then
  echo "train_benchmark: --num_query_groups (${num_query_groups}) must be a count, for --family=llama" >&2
  exit 2
fi
if [[ "${device}" != cpu && "${device}" != cuda ]]; then
  echo "train_benchmark: --device (${device}) must be cpu or cuda" >&2
  exit 2
fi
if ! [[ "${untimed_steps}" =~ ^[0-9]+$ ]] || ((untimed_steps >= steps)); then
  echo "train_benchmark: --untimed_steps (${untimed_steps}) must be in [0, --steps)" >&2
  exit 2
fi

absolute() { [[ "$1" = /* ]] && echo "$1" || echo "${PWD}/$1"; }
log() { echo "train_benchmark: $*" >&2; }

if [[ -z "${python}" ]]; then
  (cd "${repo_root}" && bazel build @libtorch//:python >&2)
  python="$(cd "${repo_root}" && bazel info output_base)/external/libtorch/python"
fi
if ! "${python}" -c 'import numpy, torch' 2>/dev/null; then
  echo "train_benchmark: ${python} cannot import torch and numpy (${python}: $(head -n 1 "${python}"));" \
    "run tools/bootstrap.sh or pass --python" >&2
  exit 1
fi

if [[ -z "${work_dir}" ]]; then
  work_dir=$(mktemp -d "${TMPDIR:-/tmp}/keel-train-benchmark.XXXXXX")
fi
work_dir=$(absolute "${work_dir}")
mkdir -p "${work_dir}"
log "work directory ${work_dir}"

if [[ -z "${train_bin}" ]]; then
  log "building //tools:train and //tools:launch (bazel build --config=opt)"
  (cd "${repo_root}" && bazel build --config=opt //tools:train //tools:launch >&2)
  train_bin="$(cd "${repo_root}" && bazel info --config=opt bazel-bin)/tools/train"
fi
train_bin=$(absolute "${train_bin}")
[[ -x "${train_bin}" ]] || { echo "train_benchmark: no trainer at ${train_bin}" >&2; exit 1; }
launch_bin=$(absolute "${launch_bin:-$(dirname "${train_bin}")/launch}")
if ((ranks > 1)) && [[ ! -x "${launch_bin}" ]]; then
  echo "train_benchmark: no launcher at ${launch_bin} (--launch_bin)" >&2
  exit 1
fi

# Settings only the trainer has: no validation, no periodic or per-epoch checkpoints.
trainer_settings=(
  --config="${repo_root}/tools/recipe/default.textproto"
  --set "step_scheduler.max_steps=${steps}"
  --set step_scheduler.ckpt_every_steps=1000000000
  --set step_scheduler.save_checkpoint_every_epoch=false
  --set step_scheduler.val_every_steps=1000000000
  --set step_scheduler.validate_on_checkpoint=false
  --set data.add_extra_token_to_sequence=true
  --set sampler.dataloader_type=cyclic
  --set sampler.drop_last=true
  --set logging.log_every_steps=10
)
[[ "${device}" == cpu ]] || trainer_settings+=(--set distributed.backend=nccl)
trainer_settings+=("${trainer_extra[@]}")
reference_settings=(
  --device="${device}"
  --steps="${steps}"
  --untimed_steps="${untimed_steps}"
  --threads="${threads}"
  --log_every_steps=10
  "${reference_extra[@]}"
)
for name in "${flag_names[@]}"; do
  trainer_settings+=(--set "${field[${name}]}=${value[${name}]}")
  reference_settings+=("--${name}=${value[${name}]}")
done

# run_trainer RANKS RUN_DIR LOG [--set ...]: the trainer on RANKS processes (tools:launch
# when more than one) of ${threads} intra-op threads.
run_trainer() {
  local n=$1 run_dir=$2 out=$3
  shift 3
  rm -rf "${run_dir}"
  local launcher=()
  ((n == 1)) || launcher=("${launch_bin}" --nproc_per_node="${n}" --master_port=0 --)
  if ! OMP_NUM_THREADS=${threads} OMP_WAIT_POLICY=${wait_policy} "${launcher[@]}" "${train_bin}" \
    "${trainer_settings[@]}" --set "run_dir=${run_dir}" "$@" >"${out}" 2>&1; then
    tail -n 20 "${out}" >&2
    echo "train_benchmark: the trainer failed; log: ${out}" >&2
    exit 1
  fi
}

if [[ -z "${prefix}" ]]; then
  log "preparing the default corpus"
  run_trainer 1 "${work_dir}/corpus" "${work_dir}/corpus.log" --set step_scheduler.max_steps=1
  prefix="${work_dir}/corpus/data/corpus"
fi
prefix=$(absolute "${prefix}")
[[ -f "${prefix}.idx" && -f "${prefix}.bin" ]] ||
  { echo "train_benchmark: no indexed dataset at ${prefix}.{bin,idx}" >&2; exit 1; }

if [[ "${family}" == llama ]]; then
  initial="${work_dir}/initial_weights"
  reference_settings+=(--family=llama --num_query_groups="${num_query_groups}")
  log "the Llama's initial weights: ${initial}"
  if ! "${python}" "${repo_root}/tools/scripts/train_reference.py" --prefix="${prefix}" \
    "${reference_settings[@]}" --write_initial_weights="${initial}" >"${work_dir}/initial.log" 2>&1; then
    tail -n 20 "${work_dir}/initial.log" >&2
    echo "train_benchmark: writing the initial weights failed; log: ${work_dir}/initial.log" >&2
    exit 1
  fi
  reference_settings+=(--initial_weights="${initial}")
  trainer_settings+=(--set "model.pretrained_path=${initial}")
fi

for ((round = 1; round <= rounds; ++round)); do
  log "round ${round}/${rounds}: C++ (${steps} steps, ${ranks} rank(s) of ${threads} threads, ${device})"
  run_trainer "${ranks}" "${work_dir}/cpp_${round}" "${work_dir}/cpp_${round}.log" \
    --set "data.prefix=${prefix}"
  log "round ${round}/${rounds}: Python"
  torchrun=()
  ((ranks == 1)) || torchrun=(-m torch.distributed.run --standalone --nproc_per_node="${ranks}")
  if ! OMP_NUM_THREADS=${threads} OMP_WAIT_POLICY=${wait_policy} "${python}" "${torchrun[@]}" \
    "${repo_root}/tools/scripts/train_reference.py" \
    --prefix="${prefix}" "${reference_settings[@]}" >"${work_dir}/python_${round}.log" 2>&1; then
    tail -n 20 "${work_dir}/python_${round}.log" >&2
    echo "train_benchmark: the reference failed; log: ${work_dir}/python_${round}.log" >&2
    exit 1
  fi
done

settings_line=""
for name in "${flag_names[@]}"; do settings_line+="${name}=${value[${name}]} "; done
[[ "${family}" == gpt ]] || settings_line+="family=llama num_query_groups=${num_query_groups} "
OMP_WAIT_POLICY=${wait_policy} "${python}" - "${work_dir}" "${rounds}" "${steps}" "${untimed_steps}" "${threads}" \
  "${value[global_batch_size]}" "${value[local_batch_size]}" "${value[sequence_length]}" \
  "${ranks}" "${prefix}" "${train_bin}" "${settings_line}" "${device}" "${json_out}" \
  "${trainer_extra[*]} | ${reference_extra[*]}" <<'EOF'
import json, os, platform, re, statistics, sys

import torch

work, rounds, steps, untimed, threads, gbs, lbs, seq, ranks = sys.argv[1:10]
prefix, train_bin, hyper_parameters, device, json_out, variants = sys.argv[10:16]
rounds, steps, untimed, threads, gbs, lbs, seq, ranks = map(
    int, (rounds, steps, untimed, threads, gbs, lbs, seq, ranks))


def fail(message):
    sys.exit(f"train_benchmark: {message}")


def step_tokens(train_windows):
    """Label tokens of each step (1-based) of the trainer, all ranks together: with drop_last
    the sampler serves the training windows cut to whole global batches, each rank's share of
    an epoch in micro-batches of lbs, which the StepScheduler groups by gbs // (lbs x ranks)
    (a shorter group at an epoch's tail, were there one)."""
    per_epoch = (train_windows // gbs * gbs) // (lbs * ranks)
    acc = gbs // (lbs * ranks)
    groups = -(-per_epoch // acc)
    tail = per_epoch - (groups - 1) * acc
    return lambda s: (tail if (s - 1) % groups == groups - 1 else acc) * lbs * ranks * seq


def cpp_run(r):
    log = open(os.path.join(work, f"cpp_{r}.log")).read()
    windows = re.search(r"(\d+) training and \d+ validation windows", log)
    done = re.search(r"done at step (\d+); bookkeeping ([0-9.eE+-]+)% of ([0-9.eE+-]+) s; "
                     r"waiting for gradients ([0-9.eE+-]+)%", log)
    if not windows or not done:
        fail(f"cpp_{r}.log lacks the model or done line")
    rows = {}
    with open(os.path.join(work, f"cpp_{r}", "metrics.jsonl")) as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                rows[row["step"]] = row
    if steps not in rows or (untimed and untimed not in rows):
        fail(f"cpp_{r}/metrics.jsonl lacks step {untimed} or {steps}")
    memory = max((row.get("max_memory_allocated_gib") or 0.0) for row in rows.values())
    tokens = step_tokens(int(windows.group(1)))
    start = rows[untimed]["elapsed_seconds"] if untimed else 0.0
    seconds = rows[steps]["elapsed_seconds"] - start
    return {
        "tps": sum(tokens(s) for s in range(untimed + 1, steps + 1)) / seconds / ranks,
        "loss": float(rows[steps]["loss"]),
        "wait": float(done.group(4)),
        "book": float(done.group(2)),
        "book_ms": float(done.group(2)) / 100 * float(done.group(3)) / int(done.group(1)) * 1e3,
        "memory": memory,
    }


def python_run(r):
    # torchrun --tee prefixes each line of rank 0 with "[default0]:".
    values = dict(re.findall(r"^(?:\[default0\]:)?(\w+)=(\S+)$",
                             open(os.path.join(work, f"python_{r}.log")).read(), re.M))
    if "tokens_per_second" not in values:
        fail(f"python_{r}.log lacks tokens_per_second")
    parameters = re.search(r"model: \d+ tensors, (\d+) parameters",
                           open(os.path.join(work, f"python_{r}.log")).read())
    return {"tps": float(values["tokens_per_second"]) / ranks,
            "loss": float(values["final_loss"]),
            "wait": 100 * float(values["gradient_wait_share"]),
            "memory": float(values.get("max_memory_allocated_gib", "nan")),
            "parameters": int(parameters.group(1)) if parameters else 0}


cpp = [cpp_run(r) for r in range(1, rounds + 1)]
py = [python_run(r) for r in range(1, rounds + 1)]
cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
            if line.startswith("model name")), platform.processor())
if device == "cuda":
    where = f"on {torch.cuda.get_device_name()} (the trainer over NCCL)"
else:
    where = "on the CPU"

print("## //tools:train vs tools/scripts/train_reference.py\n")
if ranks > 1:
    print(f"- {ranks} ranks: the trainer on tools:launch, the reference in "
          "DistributedDataParallel (Gloo) on torchrun; tokens/s per rank")
print(f"- machine: {cpu}, {os.cpu_count()} cores; both {where}; {threads} threads and "
      f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']} for both; "
      f"torch {torch.__version__} (LibTorch of the same wheel for the trainer)")
print(f"- {steps} steps of {gbs} x {seq} tokens ({gbs // (lbs * ranks)} micro-batches of {lbs} "
      f"per rank), "
      f"tokens/s over steps {untimed + 1}-{steps}; {hyper_parameters.strip()}")
print("- peak tensors: the most bytes of live tensors at once (the trainer's "
      "max_memory_allocated_gib, rank 0's; torch.cuda.max_memory_allocated for Python, on GPUs)")
if variants.strip() != "|":
    print(f"- variant (trainer settings | reference flags): {variants}")
print(f"- data: {prefix}; trainer: {train_bin}; logs: {work}\n")
print("| round | C++ tokens/s | Python tokens/s | C++ / Python | C++ final loss "
      "| Python final loss | bookkeeping (share of loop) | bookkeeping per step "
      "| C++ gradient wait | Python gradient wait | C++ peak tensors GiB | Python peak tensors GiB |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")


def gib(value):
    return "n/a" if value != value else f"{value:.3f}"  # NaN: Python on the CPU counts none


def row(label, c, p):
    print(f"| {label} | {c['tps']:.1f} | {p['tps']:.1f} | {c['tps'] / p['tps']:.3f} | "
          f"{c['loss']:.4f} | {p['loss']:.4f} | {c['book']:.3g}% | {c['book_ms']:.3g} ms | "
          f"{c['wait']:.3g}% | {p['wait']:.3g}% | {gib(c['memory'])} | {gib(p['memory'])} |")


for r, (c, p) in enumerate(zip(cpp, py), start=1):
    row(r, c, p)
median = lambda runs: {key: statistics.median(run[key] for run in runs) for key in runs[0]}
row("median", median(cpp), median(py))
if json_out:
    with open(json_out, "w") as f:
        json.dump({"cpp": median(cpp), "python": median(py), "variants": variants,
                   "device": torch.cuda.get_device_name() if device == "cuda" else cpu}, f)
EOF
