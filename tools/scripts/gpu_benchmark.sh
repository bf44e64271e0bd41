#!/usr/bin/env bash
# Keel's trainer beside the Python loop on one GPU, on the shapes issue 32 measures: tokens/s,
# MFU and the ratios, one markdown table. Each row is one tools/scripts/train_benchmark.sh run
# (the trainer and tools/scripts/train_reference.py alternating on the same data, weights and
# hyper-parameters): a trainer variant beside a Python variant.
#
#   tools/scripts/gpu_benchmark.sh --train_bin=bazel-bin/tools/train [--python=python3]
#   tools/scripts/gpu_benchmark.sh --shapes=gpt2 --pairs=bf16,compiled --rounds=3
#
# Shapes (--shapes, default: default, table, gpt2):
#   default: the trainer's default GPT (h128, 4 layers, 4 heads, ffn 512, seq 128, global batch
#          16 in micro-batches of 8);
#   table: GPT h1024, 8 layers, 16 heads, ffn 4096, seq 512, byte vocabulary (256), global batch
#          32 in micro-batches of 8 (the issue's table);
#   gpt2:  GPT-2 124M: h768, 12 layers, 12 heads, ffn 3072, seq 1024, vocabulary 50304, global
#          batch 32 in micro-batches of 16;
#   llama: a GPT-2-sized Llama (tools/scripts/train_benchmark.sh --family=llama: the reference is
#          transformers' LlamaForCausalLM, both from the same initial weights): h768, 12 layers,
#          12 query heads over 4 key-value groups, SwiGLU 2048, vocabulary 50304, seq 1024,
#          global batch 32 in micro-batches of 16;
#   llama1b: Llama 3.2 1B's shape: h2048, 16 layers, 32 query heads over 8 groups, ffn 8192,
#          vocabulary 128256, seq 2048, one micro-batch of 8 a step (AutoModel's published
#          memory figures are for this micro-batch: 53.0 GB, 33.1 GB with activation
#          checkpointing, 7.3 GB adding the fused linear cross-entropy).
# Pairs (--pairs, default all), trainer | reference:
#   fp32:     fp32 (its defaults on a GPU: fused AdamW, multi-tensor clipping) | fp32 (PyTorch's
#             defaults: foreach AdamW and clipping);
#   tf32:     fp32 with model.tf32 | fp32 with TF32 matrix products;
#   bf16:     model.bf16 (Megatron's bf16: bf16 weights, float32 main weights and gradients) |
#             torch.autocast(bfloat16) (float32 weights, bf16 matrix products);
#   compiled: model.bf16 | autocast bf16 + torch.compile + AdamW(fused=True).
# MFU uses llm.c's count, 6 N + 6 L C T FLOPs per token (N: the Python model's parameters, the
# tied embedding once), over the GPU's dense bf16 peak (989.4 TFLOP/s for an H100 or H200;
# --peak_tflops for another), for every row whatever its precision.
# Each row also gives each side's peak of live tensors (max_memory_allocated).
# --device=cpu runs the same on the CPU (the fp32, bf16 and compiled pairs; TF32 is a GPU
# setting).
# --rounds (default 1), --steps (20), --untimed_steps (5: the compiled model compiles in them)
# and --prefix (an indexed dataset; default: the trainer's corpus, prepared once) go to each
# run; --work_dir keeps the logs (default a new temporary directory).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
shapes=default,table,gpt2
pairs=fp32,tf32,bf16,compiled
rounds=1
steps=20
untimed_steps=5
train_bin=""
python=""
work_dir=""
peak_tflops=""
prefix=""
device=cuda

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}
for arg in "$@"; do
  case "${arg}" in
    --shapes=*) shapes=${arg#*=} ;;
    --pairs=*) pairs=${arg#*=} ;;
    --rounds=*) rounds=${arg#*=} ;;
    --steps=*) steps=${arg#*=} ;;
    --untimed_steps=*) untimed_steps=${arg#*=} ;;
    --train_bin=*) train_bin=${arg#*=} ;;
    --python=*) python=${arg#*=} ;;
    --work_dir=*) work_dir=${arg#*=} ;;
    --peak_tflops=*) peak_tflops=${arg#*=} ;;
    --prefix=*) prefix=${arg#*=} ;;
    --device=*) device=${arg#*=} ;;
    *) usage ;;
  esac
done
[[ -n "${train_bin}" ]] || { echo "gpu_benchmark: --train_bin is required" >&2; usage; }
work_dir=${work_dir:-$(mktemp -d "${TMPDIR:-/tmp}/keel-gpu-benchmark.XXXXXX")}
mkdir -p "${work_dir}"
python=${python:-python3}
if [[ -z "${prefix}" ]]; then
  echo "gpu_benchmark: preparing the default corpus" >&2
  "${train_bin}" --config="${repo_root}/tools/recipe/default.textproto" \
    --set "run_dir=${work_dir}/corpus" --set step_scheduler.max_steps=1 >"${work_dir}/corpus.log" 2>&1
  prefix="${work_dir}/corpus/data/corpus"
fi

shape_flags() {
  case "$1" in
    default) echo "" ;;
    table) echo "--hidden_size=1024 --num_layers=8 --num_attention_heads=16 --ffn_hidden_size=4096
                 --sequence_length=512 --global_batch_size=32 --local_batch_size=8" ;;
    gpt2) echo "--hidden_size=768 --num_layers=12 --num_attention_heads=12 --ffn_hidden_size=3072
                --sequence_length=1024 --vocab_size=50304 --global_batch_size=32
                --local_batch_size=16" ;;
    llama) echo "--family=llama --hidden_size=768 --num_layers=12 --num_attention_heads=12
                 --num_query_groups=4 --ffn_hidden_size=2048 --sequence_length=1024
                 --vocab_size=50304 --global_batch_size=32 --local_batch_size=16" ;;
    llama1b) echo "--family=llama --hidden_size=2048 --num_layers=16 --num_attention_heads=32
                   --num_query_groups=8 --ffn_hidden_size=8192 --sequence_length=2048
                   --vocab_size=128256 --global_batch_size=8 --local_batch_size=8" ;;
    *) echo "gpu_benchmark: unknown shape \"$1\"; allowed: default, table, gpt2, llama, llama1b" >&2
       exit 2 ;;
  esac
}
pair_flags() {
  case "$1" in
    fp32) echo "" ;;
    tf32) echo "--trainer_set=model.tf32=true --reference_flag=--tf32" ;;
    bf16) echo "--trainer_set=model.bf16=true --reference_flag=--bf16" ;;
    compiled) echo "--trainer_set=model.bf16=true --reference_flag=--bf16
                    --reference_flag=--compile --reference_flag=--fused" ;;
    *) echo "gpu_benchmark: unknown pair \"$1\"; allowed: fp32, tf32, bf16, compiled" >&2
       exit 2 ;;
  esac
}

for shape in ${shapes//,/ }; do
  for pair in ${pairs//,/ }; do
    echo "gpu_benchmark: ${shape} ${pair}" >&2
    # shellcheck disable=SC2046
    "${repo_root}/tools/scripts/train_benchmark.sh" --device="${device}" --threads=4 \
      --rounds="${rounds}" --steps="${steps}" --untimed_steps="${untimed_steps}" \
      --train_bin="${train_bin}" --python="${python}" --work_dir="${work_dir}/${shape}_${pair}" \
      --prefix="${prefix}" \
      --json="${work_dir}/${shape}_${pair}.json" $(shape_flags "${shape}") \
      $(pair_flags "${pair}") >"${work_dir}/${shape}_${pair}.md"
  done
done

"${python}" - "${work_dir}" "${shapes}" "${pairs}" "${peak_tflops}" <<'EOF'
import json, os, sys

work, shapes, pairs, peak = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(","), sys.argv[4]
# (hidden, layers, sequence) per shape, for 6 L C T.
geometry = {"default": (128, 4, 128), "table": (1024, 8, 512), "gpt2": (768, 12, 1024),
            "llama": (768, 12, 1024), "llama1b": (2048, 16, 2048)}
labels = {"fp32": ("fp32", "fp32"), "tf32": ("fp32 + TF32", "fp32 + TF32"),
          "bf16": ("bf16 (Megatron's)", "autocast bf16"),
          "compiled": ("bf16 (Megatron's)", "autocast bf16 + compile + fused AdamW")}
rows = []
device = ""
for shape in shapes:
    for pair in pairs:
        with open(os.path.join(work, f"{shape}_{pair}.json")) as f:
            result = json.load(f)
        device = result["device"]
        c, l, t = geometry[shape]
        flops_per_token = 6 * result["python"]["parameters"] + 6 * l * c * t
        rows.append((shape, pair, result, flops_per_token))
peak_flops = float(peak) * 1e12 if peak else (989.4e12 if ("H100" in device or "H200" in device)
                                              else 0.0)
mfu = lambda tps, fpt: f"{100 * tps * fpt / peak_flops:.1f}%" if peak_flops else "n/a"
print(f"## Keel beside the Python loop on {device}\n")
print(f"- MFU: llm.c's 6N + 6LCT FLOPs per token over "
      f"{peak_flops / 1e12:.1f} TFLOP/s (dense bf16); logs: {work}\n")
print("| shape | Keel | tokens/s | MFU | Python | tokens/s | MFU | Keel / Python "
      "| final loss Keel / Python | peak tensors GiB Keel / Python |")
print("|---|---|---:|---:|---|---:|---:|---:|---|---|")
gib = lambda value: "n/a" if value != value else f"{value:.3f}"
for shape, pair, r, fpt in rows:
    keel, py = labels[pair]
    c, p = r["cpp"], r["python"]
    print(f"| {shape} | {keel} | {c['tps']:.0f} | {mfu(c['tps'], fpt)} | {py} | {p['tps']:.0f} "
          f"| {mfu(p['tps'], fpt)} | {c['tps'] / p['tps']:.3f} | {c['loss']:.4f} / "
          f"{p['loss']:.4f} | {gib(c['memory'])} / {gib(p['memory'])} |")
EOF
