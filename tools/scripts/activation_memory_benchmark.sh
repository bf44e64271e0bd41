#!/usr/bin/env bash
# A rank's peak memory under each activation-memory option of //tools:train, in one invocation,
# beside the run without it and beside --dry_run's estimate: on one rank (--threads threads),
# the same Llama-family model (model.family llama, 2 key-value groups) and the same samples,
# --steps steps each of one micro-batch of --micro_batch_size rows of --sequence_length tokens
# in float32:
#   with the byte vocabulary (256): no recomputation; full recomputation, uniform, 1 layer a
#   chunk; full, block, the first 2 layers; selective (core_attn, mlp, layernorm);
#   with a --large_vocab (65,536) vocabulary: the whole logits (loss_fn.chunk_len=0); the
#   chunked loss (its default there, 1,024 positions); the chunked loss with full recomputation;
#   on 2 ranks at tp=2 (one thread each): without and with distributed.sequence_parallel (rank
#   0's peak of live tensors, the larger rank's peak RSS);
#   --parts=moe: the same at tp=2 for a GPT of the same sizes whose MLPs are 4 experts (2 a
#   token, split over tp), whose blocks gather the whole sequence under sequence parallelism.
# --parts=recompute,loss,sp (the default) picks the groups of runs; --parts=automodel runs AutoModel's three
# configurations at --large_vocab instead: no recomputation with the whole logits; full
# recomputation (uniform, 1 layer a chunk); and that with the chunked loss.
# --device=cuda trains on GPU 0 in Megatron's bf16 (distributed.backend nccl, model.bf16), where
# the peak of live tensors is the CUDA caching allocator's. AutoModel's published Llama 3.2 1B
# figures (one H100, micro-batch 8, sequence 2048: 53.0, 33.1 and 7.3 GB) are for:
#   activation_memory_benchmark.sh --device=cuda --parts=automodel --num_layers=16 \
#     --hidden_size=2048 --num_attention_heads=32 --num_query_groups=8 --ffn_hidden_size=8192 \
#     --sequence_length=2048 --micro_batch_size=8 --large_vocab=128256 --train_bin=...
# A markdown table on stdout gives each run's peak of live tensors (the trainer's
# max_memory_allocated_gib, rank 0's, over its steps) and its share of its reference's (the
# first run of its vocabulary), its activations as measured (that peak less the dry run's model
# state), the dry run's activations and model state, its peak resident memory (GNU time's
# maximum RSS: the tensors, the process and what the C heap keeps of freed buffers) with its
# share, and the final loss (recomputation changes no bit; the chunked loss only rounding).
#
#   tools/scripts/activation_memory_benchmark.sh                 # from the repository root
#   tools/scripts/activation_memory_benchmark.sh --sequence_length=8192 --steps=2
#
# --sequence_length=4096 --micro_batch_size=2 --large_vocab=65536 and, as
# tools/scripts/train_runs.sh reads them, --steps=3 --threads=2, --train_bin, --work_dir and the
# model's --num_layers=4 --hidden_size=256 --num_attention_heads=8 --ffn_hidden_size=1024
# (--rounds and --untimed_steps are read and unused: memory does not vary by round). Without
# --train_bin it builds `bazel build --config=opt //tools:train //tools:launch`.
set -euo pipefail

bench=activation_memory_benchmark
sequence_length=4096
micro_batch_size=2
large_vocab=65536
parts=recompute,loss,sp
device=cpu
num_query_groups=2
args=(--steps=3 --untimed_steps=0)
for arg in "$@"; do
  case "${arg}" in
    --sequence_length=*) sequence_length=${arg#*=} ;;
    --micro_batch_size=*) micro_batch_size=${arg#*=} ;;
    --large_vocab=*) large_vocab=${arg#*=} ;;
    --parts=*) parts=${arg#*=} ;;
    --device=*) device=${arg#*=} ;;
    --num_query_groups=*) num_query_groups=${arg#*=} ;;
    *) args+=("${arg}") ;;
  esac
done
set -- "${args[@]}"
source "$(dirname "${BASH_SOURCE[0]}")/train_runs.sh"

if [[ "${device}" != cpu && "${device}" != cuda ]]; then
  echo "${bench}: --device (${device}) must be cpu or cuda" >&2
  exit 2
fi
# The model of the runs that follow.
family=(--set model.family=llama --set "model.num_query_groups=${num_query_groups}")
shape=(--set "data.sequence_length=${sequence_length}" --set data.validation_every_n_samples=0
  --set "step_scheduler.local_batch_size=${micro_batch_size}"
  --set "step_scheduler.global_batch_size=${micro_batch_size}" --set logging.log_every_steps=1)
full=(--set model.recompute_granularity=full --set model.recompute_method=uniform
  --set model.recompute_num_layers=1)
block=(--set model.recompute_granularity=full --set model.recompute_method=block
  --set model.recompute_num_layers=2)
selective=(--set model.recompute_granularity=selective
  --set model.recompute_modules=core_attn,mlp,layernorm)
large=(--set "model.vocab_size=${large_vocab}")
[[ "${device}" == cpu ]] || shape+=(--set distributed.backend=nccl --set model.bf16=true)

# measure NAME RANKS [--set ...]: the run of `family`, and the dry run's memory lines in
# NAME.dry.
measure() {
  local name=$1 ranks=$2
  shift 2
  set -- "${family[@]}" "$@"
  echo "${bench}: ${name}" >&2
  run "${name}" 1 "${ranks}" "$((ranks == 1 ? threads : 1))" "${shape[@]}" "$@"
  "${launch_bin}" --nproc_per_node="${ranks}" --master_port=0 -- "${train_bin}" "${common[@]}" \
    "${shape[@]}" "$@" --set "run_dir=${work_dir}/${name}.dry_run" \
    --set "data.prefix=${work_dir}/corpus" --dry_run >"${work_dir}/${name}.dry" 2>&1
}
wants() { [[ ",${parts}," == *",$1,"* ]]; }
if wants recompute; then
  measure none 1 --set loss_fn.chunk_len=0
  measure full_uniform_1 1 "${full[@]}"
  measure full_block_2 1 "${block[@]}"
  measure selective 1 "${selective[@]}"
fi
if wants loss; then
  measure whole_logits 1 "${large[@]}" --set loss_fn.chunk_len=0
  measure chunked_loss 1 "${large[@]}"
  measure chunked_loss_full 1 "${large[@]}" "${full[@]}"
fi
if wants automodel; then
  measure automodel_none 1 "${large[@]}" --set loss_fn.chunk_len=0
  measure automodel_full 1 "${large[@]}" --set loss_fn.chunk_len=0 "${full[@]}"
  measure automodel_full_chunked 1 "${large[@]}" --set loss_fn.chunk_len=1024 "${full[@]}"
fi
if wants sp; then
  measure tp2 2 --set distributed.tensor_model_parallel_size=2
  measure tp2_sequence_parallel 2 --set distributed.tensor_model_parallel_size=2 \
    --set distributed.sequence_parallel=true
fi
if wants moe; then
  family=(--set model.family=gpt --set model.num_moe_experts=4 --set model.moe_router_topk=2)
  measure tp2_moe 2 --set distributed.tensor_model_parallel_size=2
  measure tp2_moe_sequence_parallel 2 --set distributed.tensor_model_parallel_size=2 \
    --set distributed.sequence_parallel=true
fi

python3 - "${work_dir}" "${sequence_length}" "${micro_batch_size}" "${large_vocab}" "${threads}" <<'PY'
import json
import os
import re
import sys

work_dir, seq, rows, vocab, threads = sys.argv[1:6]


def mib(text):
    return float(text.split(" MiB")[0])


def measure(name):
    rss = int(open(f"{work_dir}/{name}.1.rss").read().split()[-1]) / 1024.0
    metrics = [json.loads(line) for line in open(f"{work_dir}/{name}.1/metrics.jsonl")]
    tensors = max(m["max_memory_allocated_gib"] or 0.0 for m in metrics) * 1024.0
    dry = open(f"{work_dir}/{name}.dry").read()
    state = re.search(r"memory per rank.*: ([0-9.]+ MiB) before activations", dry).group(1)
    activations = re.search(r"about ([0-9.]+ MiB) at a step's peak", dry).group(1)
    return {"rss": rss, "tensors": tensors, "loss": metrics[-1]["loss"], "state": mib(state),
            "activations": mib(activations)}


rows_ = [("none", "none", "byte vocabulary, no recomputation"),
         ("full_uniform_1", "none", "full, uniform, 1 layer a chunk"),
         ("full_block_2", "none", "full, block, first 2 layers"),
         ("selective", "none", "selective: core_attn, mlp, layernorm"),
         ("whole_logits", "whole_logits", f"vocabulary {vocab}: whole logits"),
         ("chunked_loss", "whole_logits", "chunked loss (1,024 positions)"),
         ("chunked_loss_full", "whole_logits", "chunked loss + full, uniform, 1"),
         ("automodel_none", "automodel_none", f"vocabulary {vocab}: no recomputation, whole logits"),
         ("automodel_full", "automodel_none", "full recomputation (uniform, 1), whole logits"),
         ("automodel_full_chunked", "automodel_none", "full recomputation and the chunked loss"),
         ("tp2", "tp2", "tp=2 (2 ranks x 1 thread; rank 0)"),
         ("tp2_sequence_parallel", "tp2", "tp=2 with sequence parallelism"),
         ("tp2_moe", "tp2_moe", "GPT, 4 experts a block (2 a token): tp=2 (rank 0)"),
         ("tp2_moe_sequence_parallel", "tp2_moe", "GPT with experts: tp=2 with sequence parallelism")]
rows_ = [row for row in rows_ if os.path.exists(f"{work_dir}/{row[0]}.1.rss")]
runs = {name: measure(name) for name, _, _ in rows_}


def rss(run, base=None):
    """The peak RSS in MiB, or its share of `base`'s; n/a without GNU time (0)."""
    if not run["rss"] or (base is not None and not base["rss"]):
        return "n/a"
    return f"{run['rss']:.0f}" if base is None else f"{100.0 * run['rss'] / base['rss']:.0f}%"


print(f"| run ({rows} x {seq} tokens, 1 rank x {threads} threads) | peak tensors MiB | of its reference | "
      f"activations measured MiB | dry run: activations MiB | dry run: model state MiB | "
      f"peak RSS MiB | of its reference | final loss |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
for name, base, label in rows_:
    r, b = runs[name], runs[base]
    print(f"| {label} | {r['tensors']:.0f} | {100.0 * r['tensors'] / b['tensors']:.0f}% | "
          f"{r['tensors'] - r['state']:.0f} | {r['activations']:.0f} | {r['state']:.0f} | "
          f"{rss(r)} | {rss(r, b)} | {r['loss']:.6f} |")
PY
