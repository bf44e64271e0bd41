#!/usr/bin/env bash
# Checks Keel on a lent GPU machine (no Java, Bazel, apt or network) and writes one markdown
# report: what passed, what failed, the figures.
#
#   tools/device/check.sh --prebuilt=.device-bundle        # the check, one call of ~3-4 minutes
#   tools/device/check.sh --prebuilt=.device-bundle --phases=profile,families,compiled_benchmarks
#   tools/device/check.sh [--report=FILE] [--phases=LIST] [--deadline=SECONDS] [--prebuilt=DIR]
#
# From the repository root. With --prebuilt=DIR (tools/device/bundle.sh's .device-bundle,
# carried) nothing is built there: the bundle's binaries run against the machine's LibTorch,
# CUDA and NCCL, the GPU tests as plain GoogleTest binaries. Its default phases are the check a
# lease is for, in order: gpu_tests; train (the default run on the GPU over NCCL beside the same
# run on the CPU); benchmarks (clipping, the fused AdamW and the cross-entropy beside
# LibTorch's own, gradient accumulation fusion beside the unfused main gradients, the Llama's
# RMSNorm, RoPE and grouped attention beside HF's forms, a micro-batch's pass captured in a CUDA
# graph beside the same launched op by op);
# trainer_benchmarks (the bf16 trainer beside the Python autocast loop on issue 32's table GPT)
# and gpt2_benchmarks (the same on GPT-2 124M). The optional phases, for a second call when
# time is left: profile (LibTorch's profiler over the bf16 step), families (the Llama-style
# families), compiled_benchmarks (beside torch.compile), llama_benchmarks (the Llama family
# beside transformers' LlamaForCausalLM, issue 46's shapes), memory_benchmarks (Llama 3.2 1B's
# peak of live tensors in AutoModel's three configurations), attention_benchmarks (the fused
# attention beside the explicit one) and checkpoint_benchmarks (checkpoints beside raw copies).
# Without --prebuilt (.bazel-device carried, tools/device/pack.sh) it builds there first and
# also runs the whole suite: phases build and tests, the default ones and the optional ones,
# which takes longer than a 15-minute lease. A phase that ended in an earlier call on this machine
# is not run again, so calls that each fit a time limit continue where the last one stopped;
# --deadline=S starts no phase after S seconds (its report says which were left). The report
# (default: $OUT/device-report.md where $OUT is set, else /tmp/keel-device-check/report.md)
# is rewritten after every phase, the logs of each beside it in /tmp/keel-device-check.
# PYTHON names the interpreter whose torch is the LibTorch (default python3; unpack.sh).
set -uo pipefail
ROOT=$(cd "$(dirname "$(readlink -f "$0")")/../.." && pwd)
WORK=/tmp/keel-device-check
REPORT=${OUT:+$OUT/device-report.md}
REPORT=${REPORT:-$WORK/report.md}
CHECK_PHASES=gpu_tests,train,benchmarks,trainer_benchmarks,gpt2_benchmarks
OPTIONAL_PHASES=profile,families,compiled_benchmarks,llama_benchmarks,memory_benchmarks
OPTIONAL_PHASES+=,attention_benchmarks,checkpoint_benchmarks
ALL_PHASES=build,$CHECK_PHASES,tests,$OPTIONAL_PHASES
PHASES=
DEADLINE=0
PREBUILT=""
for arg in "$@"; do
  case "$arg" in
    --report=*) REPORT=${arg#*=} ;;
    --phases=*) PHASES=${arg#*=} ;;
    --deadline=*) DEADLINE=${arg#*=} ;;
    --prebuilt=*) PREBUILT=$(realpath "${arg#*=}") ;;
    *) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
  esac
done
mkdir -p "$WORK" "$(dirname "$REPORT")"
cd "$ROOT"
START=$SECONDS
note() { echo "check: $*" >&2; }
BAZEL=(bazel)
OPT=(--config=cuda -c opt --curses=no --noshow_progress)

# --- the machine, and the packed Bazel (or the prebuilt bundle) ----------------------------
if [[ -n "$PREBUILT" ]]; then
  PHASES=${PHASES:-$CHECK_PHASES}
  if [[ ",$PHASES," == *,build,* || ",$PHASES," == *,tests,* ]]; then
    note "--prebuilt runs no Bazel: phases build and tests need .bazel-device instead"
    exit 2
  fi
  TORCH=$("${PYTHON:-python3}" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
  export KEEL_LIBTORCH=$TORCH CC=${CC:-$(command -v gcc || echo none)}
  # The bundle's Debian libraries, then the machine's LibTorch and the CUDA and NCCL beside it.
  LD_LIBRARY_PATH=$PREBUILT/lib:$TORCH/lib
  for lib in "$TORCH"/../nvidia/*/lib; do LD_LIBRARY_PATH+=:$(realpath "$lib"); done
  export LD_LIBRARY_PATH
  BIN=$PREBUILT/bin
  note "prebuilt: $(head -n 1 "$PREBUILT/MANIFEST")"
else
  PHASES=${PHASES:-$ALL_PHASES}
  if ! bash tools/device/unpack.sh >"$WORK/unpack.log" 2>&1; then
    cat "$WORK/unpack.log" >&2
    note "unpacking failed; see $WORK/unpack.log"
    exit 1
  fi
  # shellcheck disable=SC1091
  . /tmp/keel-bazel/env.sh
  # Convenience links of another Bazel (another output base) would be walked into by //...;
  # this one makes its own.
  for link in bazel-*; do if [[ -L "$link" ]]; then rm "$link"; fi; done
  BIN=$(bazel info "${OPT[@]}" bazel-bin 2>/dev/null)
fi

# phase NAME: runs the function NAME unless it ended before; records its status and seconds.
phase() {
  local name=$1
  [[ ",$PHASES," == *",$name,"* ]] || return 0
  if [[ -f "$WORK/$name.status" ]]; then
    note "$name: done in an earlier call ($(cat "$WORK/$name.status"))"
    return 0
  fi
  if ((DEADLINE > 0 && SECONDS - START > DEADLINE)); then
    note "$name: left for a later call (--deadline=$DEADLINE)"
    echo "$name" >>"$WORK/left"
    return 0
  fi
  note "$name ..."
  local begin=$SECONDS status=0
  "$name" >"$WORK/$name.log" 2>&1 || status=$?
  echo "$([[ $status == 0 ]] && echo passed || echo "failed (exit $status)") in $((SECONDS - begin)) s" \
    >"$WORK/$name.status"
  note "$name: $(cat "$WORK/$name.status")"
  report
}

build() { "${BAZEL[@]}" build "${OPT[@]}" -k //...; }

# The tests tagged gpu, and those with GPU cases among CPU ones (a tag filter would drop them).
gpu_tests() {
  local status=0
  if [[ -n "$PREBUILT" ]]; then
    for test in optim/fused_adamw_test checkpoint/checkpoint_gpu_test base/attention_test \
      parallel/tensor_parallel/cross_entropy_test models/rms_norm_test parallel/main_grad_test; do
      "$BIN/$test" && echo "//${test%/*}:${test##*/} PASSED" || { echo "//${test%/*}:${test##*/} FAILED"; status=1; }
    done
    # The test runs the interpreter by its path (a bare name would be taken for a missing file).
    "$BIN/gradients/clip_grad_norm_torch_gpu_test" --python="$(command -v "${PYTHON:-python3}")" \
      --script=gradients/clip_grad_norm_reference.py --device=cuda &&
      echo "//gradients:clip_grad_norm_torch_gpu_test PASSED" ||
      { echo "//gradients:clip_grad_norm_torch_gpu_test FAILED"; status=1; }
    return $status
  fi
  "${BAZEL[@]}" test "${OPT[@]}" -k --test_output=errors --build_tests_only \
    --test_tag_filters=gpu //... || status=1
  "${BAZEL[@]}" test "${OPT[@]}" -k --test_output=errors \
    //gradients:offload_test //third_party/cuda:cuda_link_test \
    //parallel/tensor_parallel:cross_entropy_test //base:attention_test \
    //models:rms_norm_test || status=1
  return $status
}

# The default run on the GPU over NCCL and on the CPU over Gloo: the final losses must agree
# within 1e-3 (the same weights, data and schedule; only the kernels' rounding differs).
train() {
  local gpu cpu
  rm -rf "$WORK/train_gpu" "$WORK/train_cpu"
  local config=--config=tools/recipe/default.textproto
  "$BIN/tools/train" "$config" --set distributed.backend=nccl --set "run_dir=$WORK/train_gpu" || return 1
  "$BIN/tools/train" "$config" --set "run_dir=$WORK/train_cpu" || return 1
  gpu=$(tail -n 1 "$WORK/train_gpu/metrics.jsonl" | sed -n 's/.*"loss": *\([0-9.eE+-]*\).*/\1/p')
  cpu=$(tail -n 1 "$WORK/train_cpu/metrics.jsonl" | sed -n 's/.*"loss": *\([0-9.eE+-]*\).*/\1/p')
  echo "final loss: GPU (NCCL) $gpu, CPU (Gloo) $cpu"
  python3 -c "import sys; g, c = map(float, sys.argv[1:]); sys.exit(abs(g - c) > 1e-3)" "$gpu" "$cpu"
}

# The default run's byte corpus, which the profile and the trainer benchmarks train on: the
# train phase's, or one step's on the CPU when that phase ran on another (cold) machine.
corpus() {
  if [[ ! -f "$WORK/train_gpu/data/corpus.bin" ]]; then
    "$BIN/tools/train" --config=tools/recipe/default.textproto --set "run_dir=$WORK/train_gpu" \
      --set step_scheduler.max_steps=1 >"$WORK/corpus.log" 2>&1 || { cat "$WORK/corpus.log" >&2; return 1; }
  fi
  echo "$WORK/train_gpu/data/corpus"
}

# The Llama-style families on the GPU over NCCL (40 steps each: Llama and Qwen3 in bf16, Mistral
# with its window in float32), then a GPT-2-sized Llama in bf16 (h768, 12 layers, 4 key-value
# groups, SwiGLU 2048, vocabulary 50304, seq 1024, batch 32): each must finish, its speed read
# from the log.
family_run() {
  local name=$1
  shift
  "$BIN/tools/train" --config=tools/recipe/default.textproto --set distributed.backend=nccl \
    --set "run_dir=$WORK/$name" --set step_scheduler.ckpt_every_steps=1000 \
    --set step_scheduler.save_checkpoint_every_epoch=false \
    --set step_scheduler.val_every_steps=1000 --set step_scheduler.validate_on_checkpoint=false \
    --set step_scheduler.max_steps=40 --set logging.log_every_steps=10 "$@" || return 1
}
families() {
  rm -rf "$WORK"/family_*
  family_run family_llama --set model.family=llama --set model.num_query_groups=2 \
    --set model.bf16=true || return 1
  family_run family_qwen3 --set model.family=qwen3 --set model.num_query_groups=2 \
    --set model.kv_channels=16 --set model.bf16=true || return 1
  family_run family_mistral --set model.family=mistral --set model.num_query_groups=2 \
    --set model.window_size=32 || return 1
  family_run family_llama_gpt2 --set model.family=llama --set model.hidden_size=768 \
    --set model.num_layers=12 --set model.num_attention_heads=12 --set model.num_query_groups=4 \
    --set model.ffn_hidden_size=2048 --set model.vocab_size=50304 --set data.sequence_length=1024 \
    --set step_scheduler.global_batch_size=32 --set step_scheduler.local_batch_size=16 \
    --set model.bf16=true --set step_scheduler.max_steps=12 --set logging.log_every_steps=1 \
    --set "data.prefix=$WORK/family_llama/data/corpus"
}

# Where the trainer's bf16 step (model.bf16) spends its time on the GPU: LibTorch's profiler over
# steps 6-8 of the GPT that issue 32's table measures (h1024, 8 layers, seq 512, batch 32 in
# micro-batches of 8), then of GPT-2 124M (h768, 12 layers, seq 1024, vocabulary 50304, batch 32
# in micro-batches of 16), then of the Llama of GPT-2's size (issue 46's `llama` shape), to see
# which of its kernels still cost what the GPT's do not. Two steps follow, so that the run's one
# checkpoint, after its last, stays out of it (the corpus's epoch ends within the profile: no
# checkpoint there).
profile_run() {
  local name=$1
  shift
  local prefix
  prefix=$(corpus) || return 1
  rm -rf "$WORK/$name"
  "$BIN/tools/train" --config=tools/recipe/default.textproto --set distributed.backend=nccl \
    --set "run_dir=$WORK/$name" --set "data.prefix=$prefix" \
    --set model.bf16=true --set step_scheduler.max_steps=10 \
    --set step_scheduler.ckpt_every_steps=1000 --set step_scheduler.val_every_steps=1000 \
    --set step_scheduler.validate_on_checkpoint=false \
    --set step_scheduler.save_checkpoint_every_epoch=false --set logging.log_every_steps=1 \
    --set logging.profile_steps=3 --set logging.profile_after_step=5 "$@"
}
profile() {
  echo "## table GPT (h1024, 8 layers, seq 512), bf16"
  profile_run profile --set model.hidden_size=1024 --set model.num_layers=8 \
    --set model.num_attention_heads=16 --set model.ffn_hidden_size=4096 \
    --set data.sequence_length=512 --set step_scheduler.global_batch_size=32 || return 1
  echo "## GPT-2 124M (h768, 12 layers, seq 1024, vocabulary 50304), bf16"
  profile_run profile_gpt2 --set model.hidden_size=768 --set model.num_layers=12 \
    --set model.num_attention_heads=12 --set model.ffn_hidden_size=3072 \
    --set model.vocab_size=50304 --set data.sequence_length=1024 \
    --set step_scheduler.global_batch_size=32 --set step_scheduler.local_batch_size=16 || return 1
  echo "## the GPT-2-sized Llama (h768, 12 layers, 12 query heads over 4 groups, SwiGLU 2048), bf16"
  profile_run profile_llama_gpt2 --set model.family=llama --set model.hidden_size=768 \
    --set model.num_layers=12 --set model.num_attention_heads=12 --set model.num_query_groups=4 \
    --set model.ffn_hidden_size=2048 --set model.vocab_size=50304 \
    --set data.sequence_length=1024 --set step_scheduler.global_batch_size=32 \
    --set step_scheduler.local_batch_size=16
}

tests() { "${BAZEL[@]}" test "${OPT[@]}" -k --test_output=errors //...; }

benchmarks() {
  local status=0
  "$BIN/gradients/clip_grad_norm_benchmark" --benchmark_filter=cuda || status=1
  "$BIN/optim/fused_adamw_benchmark" --benchmark_filter=cuda || status=1
  "$BIN/parallel/tensor_parallel/cross_entropy_benchmark" --benchmark_filter=cuda || status=1
  "$BIN/gradients/main_grad_fusion_benchmark" --benchmark_filter=cuda || status=1
  "$BIN/models/llama_blocks_benchmark" --benchmark_filter=cuda || status=1
  "$BIN/base/attention_benchmark" --benchmark_filter='Grouped.*cuda' || status=1
  "$BIN/models/cuda_graph_benchmark" --benchmark_filter=cuda || status=1
  return $status
}

attention_benchmarks() { "$BIN/base/attention_benchmark" --benchmark_filter=cuda; }

checkpoint_benchmarks() {
  "$BIN/checkpoint/checkpoint_benchmark" --benchmark_filter='cuda|DeviceToHost'
}

# The trainer beside the Python loop (tools/scripts/gpu_benchmark.sh's pairs): Keel's bf16
# beside autocast bf16 on issue 32's table GPT (trainer_benchmarks) and on GPT-2 124M
# (gpt2_benchmarks); compiled_benchmarks beside autocast bf16 compiled, on both. (fp32 beside
# fp32: docs/device-reports/2026-11-27-h100.md.) 12 steps, the first 4 untimed (the compiled
# model compiles in them).
trainer_benchmark() {
  local prefix
  prefix=$(corpus) || return 1
  tools/scripts/gpu_benchmark.sh --train_bin="$BIN/tools/train" --python="${PYTHON:-python3}" \
    --prefix="$prefix" --steps=12 --untimed_steps=4 "$@"
}
trainer_benchmarks() {
  trainer_benchmark --shapes=table --pairs=bf16 --work_dir="$WORK/gpu_benchmark_table"
}
gpt2_benchmarks() {
  trainer_benchmark --shapes=gpt2 --pairs=bf16 --work_dir="$WORK/gpu_benchmark_gpt2"
}
compiled_benchmarks() {
  trainer_benchmark --shapes=table,gpt2 --pairs=compiled --work_dir="$WORK/gpu_benchmark_compiled"
}
# Llama 3.2 1B's shape in bf16 (micro-batch 8, sequence 2048): the peak of live tensors without
# recomputation, with full recomputation, and with the chunked loss too, beside the dry run's
# estimate (AutoModel's published 53.0, 33.1 and 7.3 GB on one H100).
memory_benchmarks() {
  tools/scripts/activation_memory_benchmark.sh --device=cuda --parts=automodel --num_layers=16 \
    --hidden_size=2048 --num_attention_heads=32 --num_query_groups=8 --ffn_hidden_size=8192 \
    --sequence_length=2048 --micro_batch_size=8 --large_vocab=128256 \
    --train_bin="$BIN/tools/train" --work_dir="$WORK/memory_benchmark"
}
# The GPT-2-sized Llama in bf16 beside transformers' model under autocast, plain and compiled,
# and Llama 3.2 1B's shape in bf16 (tokens/s, MFU and both sides' peak of live tensors).
llama_benchmarks() {
  trainer_benchmark --shapes=llama --pairs=bf16,compiled --work_dir="$WORK/gpu_benchmark_llama" &&
    trainer_benchmark --shapes=llama1b --pairs=bf16 --work_dir="$WORK/gpu_benchmark_llama1b"
}

# The report: the machine, each phase's status, the tests' verdicts, the figures.
report() {
  {
    echo "# Keel on a GPU machine: $(date -u +%FT%TZ)"
    echo
    if [[ -n "$PREBUILT" ]]; then
      echo "- binaries: $(head -n 1 "$PREBUILT/MANIFEST") ($(sed -n 2p "$PREBUILT/MANIFEST"))"
    else
      echo "- commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)$(
        git -C "$ROOT" diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
    fi
    echo "- GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo none)"
    echo "- PyTorch: $("${PYTHON:-python3}" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)' 2>/dev/null)"
    echo "- LibTorch: $KEEL_LIBTORCH; compiler: $CC ($("$CC" -dumpfullversion 2>/dev/null))"
    echo "- $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME"); $(nproc) cores"
    echo
    echo "| phase | result |"
    echo "|---|---|"
    for name in ${PHASES//,/ }; do
      echo "| $name | $(cat "$WORK/$name.status" 2>/dev/null || echo "not run") |"
    done
    if [[ -f "$WORK/profile.log" ]]; then
      echo
      echo "## where the bf16 step's time goes (steps 6-8)"
      awk '/^## /{ if (n > 0) print "```"; n = 0; print "\n" $0 "\n"; next } /^profile of steps/{ n = 45; print "```" }
           n > 0 { print; if (--n == 0) print "```" } END { if (n > 0) print "```" }' "$WORK/profile.log"
    fi
    for name in gpu_tests tests; do
      [[ -f "$WORK/$name.log" ]] || continue
      echo
      echo "## $name"
      echo
      echo '```'
      grep -E '^//.* (PASSED|FAILED|TIMEOUT|NO STATUS|SKIPPED|FLAKY)|Executed .* tests|FAILED TO BUILD|^\[  (SKIPPED|FAILED) ' \
        "$WORK/$name.log" | sed 's/  */ /g'
      echo '```'
    done
    if [[ -f "$WORK/build.log" ]] && grep -q '^ERROR' "$WORK/build.log"; then
      echo
      echo "## build errors"
      echo
      echo '```'
      grep -A3 '^ERROR' "$WORK/build.log" | head -n 60
      echo '```'
    fi
    if [[ -f "$WORK/families.log" ]]; then
      echo
      echo "## the Llama-style families on the GPU (last logged step of each run)"
      echo
      grep -E '^step +(40/40|12/12)' "$WORK/families.log" | sed 's/^/    /'
    fi
    if [[ -f "$WORK/train.log" ]]; then
      echo
      echo "## the default run, GPU (NCCL) beside CPU (Gloo)"
      echo
      grep -E '^final loss|^done at step|tokens/s' "$WORK/train.log" | tail -n 6 | sed 's/^/    /'
    fi
    for name in trainer_benchmarks gpt2_benchmarks compiled_benchmarks llama_benchmarks; do
      [[ -f "$WORK/$name.log" ]] || continue
      echo
      sed -n '/^## Keel beside/,/^$/p; /^|/p' "$WORK/$name.log" | awk '!seen[$0]++'
    done
    if [[ -f "$WORK/memory_benchmarks.log" ]]; then
      echo
      echo "## Llama 3.2 1B's peak of live tensors (AutoModel: 53.0 / 33.1 / 7.3 GB on one H100)"
      echo
      grep '^|' "$WORK/memory_benchmarks.log"
    fi
    for name in benchmarks attention_benchmarks checkpoint_benchmarks; do
      [[ -f "$WORK/$name.log" ]] || continue
      echo
      echo "## $name"
      echo
      echo '```'
      grep -vE '^(train_benchmark|\*\*\*|Run on|CPU Caches|  L[123]|Load Average|-+$)' \
        "$WORK/$name.log" | grep -v '^$' | tail -n 80
      echo '```'
    done
    if [[ -f "$WORK/left" ]]; then
      echo
      echo "Left for a later call: $(sort -u "$WORK/left" | tr '\n' ' ')"
    fi
  } >"$REPORT"
}

rm -f "$WORK/left"
for name in ${PHASES//,/ }; do phase "$name"; done
report
note "report: $REPORT"
! grep -q failed "$WORK"/*.status 2>/dev/null
