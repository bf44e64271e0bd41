#!/usr/bin/env python3
"""The training loop of //tools:train in plain PyTorch, as the throughput baseline.

Mirrors tools/recipe/run_step.cc step for step on the same data and hyper-parameters: the GPT
of tools/recipe/gpt.cc (same module names, construction order and initialisation), GPT windows
of a Megatron indexed dataset cut as sampling/fixed_window_dataset.h cuts them, every n-th
window held out for validation (never run here), MegatronPretrainingRandomSampler's per-epoch
torch.randperm(seed = epoch), micro-batches grouped into steps of global / local batch size
(a shorter group at an epoch's tail), the summed cross-entropy divided by the label tokens of
the step, torch.nn.utils.clip_grad_norm_, AdamW, and Megatron-Core's OptimizerParamScheduler
formulas (optim/param_scheduler.cc) for the learning rate and weight decay. No validation,
checkpoints or metric files.

With --family=llama the model is transformers' LlamaForCausalLM (SDPA attention, tied
embeddings, float32 weights) of the trainer's model.family "llama" shape (--num_query_groups
key-value heads, --rotary_base, --norm_epsilon). Its weights are a Hugging Face directory that
--write_initial_weights=DIR writes (drawn from --seed, then the script exits) and
--initial_weights=DIR starts from; the trainer starts from the same directory
(model.pretrained_path), so both loops see the same weights and batches:

    .venv/bin/python tools/scripts/train_reference.py --prefix=P --family=llama \
        --num_query_groups=2 --write_initial_weights=/tmp/llama
    .venv/bin/python tools/scripts/train_reference.py --prefix=P --family=llama \
        --num_query_groups=2 --initial_weights=/tmp/llama

    .venv/bin/python tools/scripts/train_reference.py --prefix=runs/default/data/corpus --threads=2

Under torchrun (WORLD_SIZE > 1) it is data-parallel as the trainer on tools:launch is: the
model in DistributedDataParallel over Gloo, no_sync on all but a step's last micro-batch, the
random sampler's per-rank buckets, the label tokens and the loss summed over the ranks:

    .venv/bin/python -m torch.distributed.run --standalone --redirects=1 --tee=1 --nproc_per_node=2 \
        tools/scripts/train_reference.py --prefix=runs/default/data/corpus --threads=1

With --device=cuda it trains on the GPU (each rank on GPU LOCAL_RANK, DDP over NCCL), as the
trainer does with distributed.backend=nccl. The one-line speed-ups a Python user has, each off
by default: --bf16 (the forward passes under torch.autocast to bfloat16, the loss in float32,
backward outside), --compile (torch.compile of the model), --fused (AdamW(fused=True); PyTorch's
default is its multi-tensor foreach step on GPUs, a loop over the parameters on the CPU) and
--tf32 (float32 matrix products on TF32 tensor cores).

The last line is machine-readable: tokens_per_second=N, the label tokens of the steps after
--untimed_steps divided by the wall-clock seconds they took (tools/scripts/train_benchmark.sh
computes the C++ trainer's figure the same way from its metrics.jsonl), for all ranks together;
gradient_wait_share=F is the share of the loop spent after the last gradient bucket was ready
(DDP's comm hook) until backward returned with the averaged gradients, the trainer's
"waiting for gradients" (0 on one process); on a GPU max_memory_allocated_gib=F is rank 0's
torch.cuda.max_memory_allocated over the run, in GiB.
Needs PyTorch (2.6 or later, the one whose LibTorch the trainer uses: @libtorch//:python) and
NumPy; --family=llama also transformers.
"""

import argparse
import contextlib
import math
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

# Megatron's DType codes (megatron/core/datasets/indexed_dataset.py; sampling/indexed_dataset.h).
_DTYPES = {
    1: np.uint8,
    2: np.int8,
    3: np.int16,
    4: np.int32,
    5: np.int64,
    6: np.float64,
    7: np.float32,
    8: np.uint16,
}
_MAGIC = b"MMIDIDX\x00\x00"
_HEADER_BYTES = 34


def read_indexed_tokens(prefix):
    """The tokens of every sequence of <prefix>.bin/.idx laid end to end, as a 1-D array.

    Zero-copy (a memmap) when the sequences lie back to back from the start of the .bin, as
    Megatron writes them; otherwise the sequences are copied together in index order.
    """
    idx = np.memmap(prefix + ".idx", dtype=np.uint8, mode="r")
    if idx.size < _HEADER_BYTES or bytes(idx[:9]) != _MAGIC:
        raise ValueError(f"{prefix}.idx: not a Megatron indexed dataset (bad magic)")
    version = int(idx[9:17].view("<u8")[0])
    if version != 1:
        raise ValueError(f"{prefix}.idx: version {version}, expected 1")
    code = int(idx[17])
    if code not in _DTYPES:
        raise ValueError(f"{prefix}.idx: unknown dtype code {code}")
    dtype = np.dtype(_DTYPES[code]).newbyteorder("<")
    if dtype.kind == "f":
        raise ValueError(f"{prefix}.idx: floating-point tokens ({dtype.name}) cannot be GPT tokens")
    n = int(idx[18:26].view("<u8")[0])
    d = int(idx[26:34].view("<u8")[0])
    expected_size = _HEADER_BYTES + 12 * n + 8 * d
    if idx.size != expected_size:
        raise ValueError(f"{prefix}.idx: {idx.size} bytes, expected 34 + 12*{n} + 8*{d} = "
                         f"{expected_size} (multimodal datasets are not supported)")
    lengths = idx[_HEADER_BYTES:_HEADER_BYTES + 4 * n].view("<i4").astype(np.int64)
    pointers = idx[_HEADER_BYTES + 4 * n:_HEADER_BYTES + 12 * n].view("<i8")
    bin_tokens = np.memmap(prefix + ".bin", dtype=dtype, mode="r")
    total = int(lengths.sum())
    back_to_back = np.zeros(n, dtype=np.int64)
    np.cumsum(lengths[:-1], out=back_to_back[1:])
    if np.array_equal(pointers, back_to_back * dtype.itemsize):
        if total > bin_tokens.size:
            raise ValueError(f"{prefix}.bin: {bin_tokens.size} tokens, the index needs {total}")
        return bin_tokens[:total]
    starts = pointers // dtype.itemsize
    return np.concatenate([bin_tokens[s:s + l] for s, l in zip(starts, lengths)])


class GptWindows:
    """sampling/fixed_window_dataset.h's FixedWindowDataset split as tools/recipe/data.cc's Splits splits it.

    Window i is tokens [i*L, i*L + L + 1) of the concatenated sequences (L = sequence_length,
    add_extra_token_to_sequence = true); with n = validation_every_n_samples, windows
    n-1, 2n-1, ... are validation and the rest, in order, the training split.
    """

    def __init__(self, tokens, sequence_length, validation_every_n_samples):
        if sequence_length <= 1:
            raise ValueError(f"sequence_length ({sequence_length}) must be > 1")
        if validation_every_n_samples == 1 or validation_every_n_samples < 0:
            raise ValueError(f"validation_every_n_samples ({validation_every_n_samples}) must be "
                             "0 (no validation) or >= 2")
        self.tokens = tokens
        self.sequence_length = sequence_length
        self.size = (tokens.size - 1) // sequence_length
        self.every_n = validation_every_n_samples
        val_size = 0 if self.every_n == 0 else self.size // self.every_n
        self.train_size = self.size - val_size
        self._offsets = np.arange(sequence_length + 1, dtype=np.int64)

    def _train_index(self, j):
        if self.every_n == 0:
            return j
        return (j // (self.every_n - 1)) * self.every_n + j % (self.every_n - 1)

    def batch(self, train_indices):
        """Training windows [count, sequence_length + 1] as an int64 tensor."""
        windows = self._train_index(np.asarray(train_indices, dtype=np.int64))
        positions = windows[:, None] * self.sequence_length + self._offsets[None, :]
        return torch.from_numpy(self.tokens[positions].astype(np.int64))


def random_sampler_epochs(total_samples, micro_batch_size, rank, world_size):
    """MegatronPretrainingRandomSampler for `rank`, drop_last, seed 0: per epoch, the
    micro-batches of the rank's bucket (the rank-th of world_size equal slices) in the order of
    torch.randperm(bucket) on a generator seeded with the epoch."""
    bucket_size = (total_samples // (micro_batch_size * world_size)) * micro_batch_size
    if bucket_size == 0:
        raise ValueError(f"{total_samples} training windows: fewer than one micro-batch of "
                         f"{micro_batch_size} per rank for {world_size} rank(s)")
    epoch = 0
    while True:
        generator = torch.Generator()
        generator.manual_seed(epoch)
        order = torch.randperm(bucket_size, generator=generator).numpy() + rank * bucket_size
        yield [order[i:i + micro_batch_size]
               for i in range(0, bucket_size - micro_batch_size + 1, micro_batch_size)]
        epoch += 1


def steps(total_samples, micro_batch_size, grad_acc_steps, rank, world_size):
    """The StepScheduler's groups: grad_acc_steps micro-batches, fewer at an epoch's tail."""
    for micro_batches in random_sampler_epochs(total_samples, micro_batch_size, rank,
                                               world_size):
        for i in range(0, len(micro_batches), grad_acc_steps):
            yield micro_batches[i:i + grad_acc_steps]


class ParamSchedule:
    """OptimizerParamScheduler.get_lr / get_wd (optim/param_scheduler.cc, same operand order)."""

    def __init__(self, args):
        self.a = args
        if args.lr_decay_style not in ("constant", "linear", "cosine", "inverse-square-root"):
            raise ValueError(f"lr_decay_style \"{args.lr_decay_style}\" is not supported here; "
                             "allowed: \"constant\", \"linear\", \"cosine\", "
                             "\"inverse-square-root\"")
        if args.lr_warmup_steps >= args.lr_decay_steps:
            raise ValueError(f"lr_warmup_steps ({args.lr_warmup_steps}) must be < "
                             f"lr_decay_steps ({args.lr_decay_steps})")
        if args.wd_incr_style == "constant" and args.start_wd != args.end_wd:
            raise ValueError(f"start_wd ({args.start_wd}) must equal end_wd ({args.end_wd}) "
                             "with wd_incr_style \"constant\"")

    def lr(self, n):
        a = self.a
        if a.lr_warmup_steps > 0 and n <= a.lr_warmup_steps:
            return a.init_lr + ((a.max_lr - a.init_lr) * float(n) / float(a.lr_warmup_steps))
        if a.lr_decay_style == "constant":
            return a.max_lr
        if n > a.lr_decay_steps:
            return a.min_lr
        if a.lr_decay_style == "inverse-square-root":
            lr = a.max_lr * max(a.lr_warmup_steps, 1) ** 0.5 / max(n, 1) ** 0.5
            return max(a.min_lr, lr)
        decay_ratio = float(n - a.lr_warmup_steps) / float(a.lr_decay_steps - a.lr_warmup_steps)
        delta_lr = a.max_lr - a.min_lr
        if a.lr_decay_style == "linear":
            coeff = 1.0 - decay_ratio
        else:
            coeff = 0.5 * (math.cos(math.pi * decay_ratio) + 1.0)
        return a.min_lr + coeff * delta_lr

    def wd(self, n):
        a = self.a
        if n > a.wd_incr_steps or a.wd_incr_style == "constant":
            return a.end_wd
        incr_ratio = float(n) / float(a.wd_incr_steps)
        if a.wd_incr_style == "linear":
            coeff = incr_ratio
        else:
            coeff = 0.5 * (math.cos(math.pi * (1 - incr_ratio)) + 1.0)
        return a.start_wd + coeff * (a.end_wd - a.start_wd)


def causal_attention(q, k, v):
    """base/attention.cc's CausalAttention: torch's fused kernel."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Attention(nn.Module):
    """parallel/tensor_parallel/layers.cc's ParallelSelfAttentionImpl on one rank: the fused
    qkv projection's rows go head by head ([q, k, v] of head 0, then of head 1, ...)."""

    def __init__(self, hidden_size, num_attention_heads):
        super().__init__()
        self.heads = num_attention_heads
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size)
        self.proj = nn.Linear(hidden_size, hidden_size)

    def forward(self, x):
        batch, seq, hidden = x.shape
        head_dim = hidden // self.heads
        qkv = self.qkv(x).view(batch, seq, self.heads, 3, head_dim)
        q, k, v = (qkv.select(3, i).transpose(1, 2) for i in range(3))
        attended = causal_attention(q, k, v)
        return self.proj(attended.transpose(1, 2).contiguous().view(batch, seq, hidden))


class Block(nn.Module):
    """tools/recipe/gpt.cc's BlockImpl: pre-LayerNorm causal self-attention and a GELU MLP."""

    def __init__(self, hidden_size, num_attention_heads, ffn_hidden_size):
        super().__init__()
        self.ln_1 = nn.LayerNorm(hidden_size)
        self.attn = Attention(hidden_size, num_attention_heads)
        self.ln_2 = nn.LayerNorm(hidden_size)
        self.fc = nn.Linear(hidden_size, ffn_hidden_size)
        self.mlp_proj = nn.Linear(ffn_hidden_size, hidden_size)

    def forward(self, x):
        h = x + self.attn(self.ln_1(x))
        return h + self.mlp_proj(F.gelu(self.fc(self.ln_2(h))))


class LmHead(nn.Module):
    """Holds the embedding's weight itself (a tie, not a copy), as tools/recipe/gpt.cc's LmHeadImpl."""

    def __init__(self, tied):
        super().__init__()
        self.weight = tied


class Gpt(nn.Module):
    """tools/recipe/gpt.cc's GptImpl on one rank: the same parameters in the same order. Keel's
    layers allocate zeros and draw nothing, so the generator is seeded again after these
    modules' own initialisers; then, in named_parameters() order and skipping LayerNorms
    ("ln_"), zero biases and N(0, 0.02) for every other parameter, as Keel draws them."""

    def __init__(self, vocab_size, hidden_size, num_layers, num_attention_heads,
                 ffn_hidden_size, max_sequence_length, seed):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, hidden_size)
        self.wpe = nn.Embedding(max_sequence_length, hidden_size)
        self.blocks = nn.ModuleList(
            Block(hidden_size, num_attention_heads, ffn_hidden_size) for _ in range(num_layers))
        self.ln_f = nn.LayerNorm(hidden_size)
        torch.manual_seed(seed)
        with torch.no_grad():
            for name, parameter in self.named_parameters():
                if "ln_" in name:
                    continue
                if ".bias" in name:
                    parameter.zero_()
                else:
                    parameter.normal_(0.0, 0.02)
        self.lm_head = LmHead(self.wte.weight)

    def forward(self, tokens):
        seq = tokens.size(1)
        positions = torch.arange(seq, dtype=torch.long, device=tokens.device)
        x = self.wte(tokens) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.lm_head.weight)


def llama(args, padded_vocab_size):
    """transformers' LlamaForCausalLM of the trainer's Llama shape, its weights from
    --initial_weights (or drawn from --seed for --write_initial_weights)."""
    import transformers  # only this family needs it

    if args.initial_weights:
        return transformers.LlamaForCausalLM.from_pretrained(
            args.initial_weights, dtype=torch.float32, attn_implementation="sdpa")
    config = transformers.LlamaConfig(
        vocab_size=padded_vocab_size, hidden_size=args.hidden_size,
        intermediate_size=args.ffn_hidden_size, num_hidden_layers=args.num_layers,
        num_attention_heads=args.num_attention_heads,
        num_key_value_heads=args.num_query_groups or args.num_attention_heads,
        max_position_embeddings=args.sequence_length, rms_norm_eps=args.norm_epsilon,
        rope_theta=args.rotary_base, tie_word_embeddings=True, use_cache=False,
        attn_implementation="sdpa")
    torch.manual_seed(args.seed)
    return transformers.LlamaForCausalLM(config)


class Logits(nn.Module):
    """A causal language model's logits alone, as Gpt.forward returns them."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, tokens):
        return self.model(input_ids=tokens, use_cache=False).logits


def parse_args(argv):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--prefix", required=True, help="Megatron indexed dataset (<prefix>.bin/.idx)")
    p.add_argument("--steps", type=int, default=60, help="optimizer steps to run")
    p.add_argument("--untimed_steps", type=int, default=5,
                   help="first steps left out of tokens_per_second (warm-up)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads (default: PyTorch's choice)")
    p.add_argument("--seed", type=int, default=1234, help="seeds model initialisation")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="where to train: the CPU, or GPU LOCAL_RANK")
    p.add_argument("--log_every_steps", type=int, default=10)
    p.add_argument("--bf16", action="store_true",
                   help="forward passes under torch.autocast(bfloat16) (mixed precision)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--fused", action="store_true", help="AdamW(fused=True)")
    p.add_argument("--tf32", action="store_true",
                   help="float32 matrix products on TF32 tensor cores (GPUs)")
    # step_scheduler and data sections of tools/recipe/default.textproto.
    p.add_argument("--global_batch_size", type=int, default=16)
    p.add_argument("--local_batch_size", type=int, default=8)
    p.add_argument("--sequence_length", type=int, default=128)
    p.add_argument("--validation_every_n_samples", type=int, default=20)
    # model section.
    p.add_argument("--family", default="gpt", choices=["gpt", "llama"],
                   help="Keel's GPT, or transformers' LlamaForCausalLM (model.family)")
    p.add_argument("--num_query_groups", type=int, default=0,
                   help="llama: key-value heads; 0: --num_attention_heads")
    p.add_argument("--rotary_base", type=float, default=10000.0, help="llama: RoPE's base")
    p.add_argument("--norm_epsilon", type=float, default=1e-5, help="llama: RMSNorm's epsilon")
    p.add_argument("--initial_weights", default="",
                   help="llama: the Hugging Face directory the model starts from")
    p.add_argument("--write_initial_weights", default="",
                   help="llama: write the model drawn from --seed to this directory and exit")
    p.add_argument("--vocab_size", type=int, default=256)
    p.add_argument("--make_vocab_size_divisible_by", type=int, default=128,
                   help="the embedding holds the vocabulary rounded up to a multiple of this")
    p.add_argument("--hidden_size", type=int, default=128)
    p.add_argument("--num_layers", type=int, default=4)
    p.add_argument("--num_attention_heads", type=int, default=4)
    p.add_argument("--ffn_hidden_size", type=int, default=512)
    # optimizer section (torch AdamW).
    p.add_argument("--lr", type=float, default=0.003)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--weight_decay", type=float, default=0.01)
    # lr_scheduler section (Megatron OptimizerParamScheduler).
    p.add_argument("--init_lr", type=float, default=0.0)
    p.add_argument("--max_lr", type=float, default=0.003)
    p.add_argument("--min_lr", type=float, default=0.0003)
    p.add_argument("--lr_warmup_steps", type=int, default=20)
    p.add_argument("--lr_decay_steps", type=int, default=200)
    p.add_argument("--lr_decay_style", default="cosine")
    p.add_argument("--start_wd", type=float, default=0.01)
    p.add_argument("--end_wd", type=float, default=0.01)
    p.add_argument("--wd_incr_steps", type=int, default=0)
    p.add_argument("--wd_incr_style", default="constant")
    # clip_grad section.
    p.add_argument("--max_norm", type=float, default=1.0,
                   help="gradient clipping threshold; inf: no clipping (norm still computed)")
    args = p.parse_args(argv)
    for name in ("steps", "global_batch_size", "local_batch_size", "hidden_size", "num_layers",
                 "num_attention_heads", "ffn_hidden_size", "vocab_size",
                 "make_vocab_size_divisible_by"):
        if getattr(args, name) <= 0:
            p.error(f"--{name} ({getattr(args, name)}) must be > 0")
    if args.global_batch_size % args.local_batch_size != 0:
        p.error(f"--global_batch_size ({args.global_batch_size}) must be a multiple of "
                f"--local_batch_size ({args.local_batch_size})")
    if args.hidden_size % args.num_attention_heads != 0:
        p.error(f"--hidden_size ({args.hidden_size}) must be divisible by "
                f"--num_attention_heads ({args.num_attention_heads})")
    if args.family == "gpt" and (args.initial_weights or args.write_initial_weights):
        p.error("--initial_weights and --write_initial_weights are for --family=llama")
    if args.family == "llama" and not (args.initial_weights or args.write_initial_weights):
        p.error("--family=llama needs --initial_weights or --write_initial_weights")
    if args.num_query_groups and args.num_attention_heads % args.num_query_groups != 0:
        p.error(f"--num_query_groups ({args.num_query_groups}) must divide "
                f"--num_attention_heads ({args.num_attention_heads})")
    if not 0 <= args.untimed_steps < args.steps:
        p.error(f"--untimed_steps ({args.untimed_steps}) must be in [0, --steps)")
    return args


class DataParallel:
    """The torchrun world (one process when WORLD_SIZE is unset): the model in DDP over Gloo,
    sums over the ranks, and the time spent waiting for the gradients' all-reduce."""

    def __init__(self, device):
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.device = device
        self.wait_seconds = 0.0
        self._last_bucket_ready = None
        if self.world_size > 1:
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")

    def wrap(self, model):
        if self.world_size == 1:
            return model
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        ddp.register_comm_hook(self, DataParallel._timed_allreduce)
        return ddp

    @staticmethod
    def _timed_allreduce(self, bucket):
        self._last_bucket_ready = time.perf_counter()
        return default_hooks.allreduce_hook(None, bucket)

    def backward(self, model, loss, last):
        """loss.backward(), reducing the gradients only when `last` (DDP's no_sync before)."""
        if self.world_size == 1:
            loss.backward()
            return
        with contextlib.nullcontext() if last else model.no_sync():
            loss.backward()
        if last:
            self.wait_seconds += time.perf_counter() - self._last_bucket_ready

    def sum(self, value):
        if self.world_size == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.item()


def main(argv):
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    world = DataParallel(device)
    out = sys.stdout if world.rank == 0 else open(os.devnull, "w")
    if args.tf32:  # the API the trainer's base::SetCudaMatmulTf32 uses, where torch has it
        if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
            torch.backends.cuda.matmul.fp32_precision = "tf32"
        else:
            torch.backends.cuda.matmul.allow_tf32 = True
    autocast = (torch.autocast(device_type=device.type, dtype=torch.bfloat16) if args.bf16
                else contextlib.nullcontext())

    tokens = read_indexed_tokens(args.prefix)
    windows = GptWindows(tokens, args.sequence_length, args.validation_every_n_samples)
    if tokens.size and int(tokens.max()) >= args.vocab_size:
        raise ValueError(f"token {int(tokens.max())} in {args.prefix} does not fit vocab_size "
                         f"({args.vocab_size})")

    multiple = args.make_vocab_size_divisible_by
    padded_vocab_size = (args.vocab_size + multiple - 1) // multiple * multiple
    if args.write_initial_weights:
        llama(args, padded_vocab_size).save_pretrained(args.write_initial_weights)
        print(f"initial weights: {args.write_initial_weights}", file=out)
        return 0
    if args.family == "llama":
        model = Logits(llama(args, padded_vocab_size)).to(device)
    else:
        model = Gpt(padded_vocab_size, args.hidden_size, args.num_layers,
                    args.num_attention_heads, args.ffn_hidden_size, args.sequence_length,
                    args.seed).to(device)
    parameters = list(model.parameters())  # the tied weight once
    model = world.wrap(model)
    if args.compile:
        model = torch.compile(model)
    optimizer = torch.optim.AdamW(parameters, lr=args.lr, betas=(args.beta1, args.beta2),
                                  eps=args.eps, weight_decay=args.weight_decay,
                                  **({"fused": True} if args.fused else {}))
    schedule = ParamSchedule(args)
    per_rank = args.local_batch_size * world.world_size
    if args.global_batch_size % per_rank:
        raise ValueError(f"global_batch_size ({args.global_batch_size}) is not a multiple of "
                         f"local_batch_size x ranks ({per_rank})")
    grad_acc_steps = args.global_batch_size // per_rank
    print(f"model: {len(parameters)} tensors, {sum(p.numel() for p in parameters)} parameters; "
          f"{windows.train_size} training windows of {args.sequence_length} tokens; "
          f"{args.steps} steps of {args.global_batch_size} samples ({grad_acc_steps} "
          f"micro-batches of {args.local_batch_size} per rank on {world.world_size} rank(s)); "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, on {device}"
          f"{', bf16 autocast' if args.bf16 else ''}{', compiled' if args.compile else ''}"
          f"{', fused AdamW' if args.fused else ''}{', tf32' if args.tf32 else ''}", file=out,
          flush=True)

    timed_tokens = 0
    loop_start = time.perf_counter()
    timed_start = loop_start if args.untimed_steps == 0 else None
    first_loss = last_loss = math.nan
    interval_start, interval_tokens = time.perf_counter(), 0
    # With drop_last (this script's only mode), the trainer samples the training split cut to
    # whole global batches (SampledWindows in tools/recipe/data.cc).
    usable = windows.train_size // args.global_batch_size * args.global_batch_size
    for step, micro_batches in enumerate(
            steps(usable, args.local_batch_size, grad_acc_steps, world.rank, world.world_size),
            start=1):
        batches = [windows.batch(indices).to(device) for indices in micro_batches]
        label_tokens = world.sum(sum(b.size(0) * (b.size(1) - 1) for b in batches))

        lr, wd = schedule.lr(step - 1), schedule.wd(step - 1)
        for group in optimizer.param_groups:
            group["lr"] = lr
            group["weight_decay"] = wd
        loss_sum = 0.0
        for i, batch in enumerate(batches):
            with autocast:
                logits = model(batch[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)),
                                   batch[:, 1:].reshape(-1), reduction="sum")
            loss_sum += loss.item()
            # DDP averages the gradients over the ranks: scale so they sum to d(mean loss).
            world.backward(model, loss * (world.world_size / label_tokens),
                           i + 1 == len(batches))
        grad_norm = torch.nn.utils.clip_grad_norm_(parameters, args.max_norm).item()
        optimizer.step()
        optimizer.zero_grad()

        last_loss = world.sum(loss_sum) / label_tokens
        if step == 1:
            first_loss = last_loss
        interval_tokens += label_tokens
        if step > args.untimed_steps:
            timed_tokens += label_tokens
        if step == args.untimed_steps:
            timed_start = time.perf_counter()
        if step % args.log_every_steps == 0 or step == args.steps:
            now = time.perf_counter()
            print(f"step {step}/{args.steps} | loss {last_loss:.4f} | lr {lr:.2e} | "
                  f"grad norm {grad_norm:.3f} | {interval_tokens / (now - interval_start):.1f} "
                  "tok/s", file=out, flush=True)
            interval_start, interval_tokens = now, 0
        if step == args.steps:
            break
    end = time.perf_counter()
    timed_seconds = end - timed_start

    print(f"first_loss={first_loss:.6f}", file=out)
    print(f"final_loss={last_loss:.6f}", file=out)
    print(f"timed_steps={args.steps - args.untimed_steps}", file=out)
    print(f"timed_seconds={timed_seconds:.6f}", file=out)
    print(f"gradient_wait_share={world.wait_seconds / (end - loop_start):.6f}", file=out)
    if device.type == "cuda":
        print(f"max_memory_allocated_gib={torch.cuda.max_memory_allocated(device) / 2**30:.4f}",
              file=out)
    print(f"tokens_per_second={timed_tokens / timed_seconds:.1f}", file=out, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
