#!/usr/bin/env python3
"""Parity fixtures for Keel's Llama-family decoders, recorded from Hugging Face transformers, and a
check that a model Keel exports in the Hugging Face layout loads in transformers.

`record` builds six tiny models (Llama tied and GQA/llama3-RoPE, the same with the transformers v4
config spelling, Qwen2, Qwen3, Mistral with a sliding window; CASES below), each in float32 on the
CPU with every parameter set to seeded non-degenerate values (norm weights 1 + 0.1*randn, so that a
swapped norm or a dropped bias shows), and writes per case to OUT/<case>/:
  config.json, model.safetensors   what save_pretrained writes (the weights before the SGD step);
  expected.safetensors             inputs and what transformers computes from them: input_ids,
                                   labels, logits, loss, grad.<parameter>, hidden_states, and
                                   loss/logits after one torch.optim.SGD step (lr in its metadata).
It then reloads every case with from_pretrained and fails unless the logits are bitwise the same.
It also records LoRA adapters (ADAPTER_CASES) on a case's model with Hugging Face peft, A and B both
seeded random, into OUT/<adapter case>/: what PeftModel.save_pretrained writes (adapter_config.json,
adapter_model.safetensors) and expected.safetensors (the base case's input_ids, PeftModel's logits
and merge_and_unload()'s), checked the same way through PeftModel.from_pretrained. And it records supervised fine-tuning data
(SFT_CASES) for a case's model into OUT/<sft case>/: a tiny chat tokenizer built here (no Hub), chat
templates with and without {% generation %} blocks and one that rewrites earlier turns, conversations
(conversations.jsonl), and expected.safetensors (transformers' tokens, assistant masks, and the
answer-only loss of each conversation on the base model).
testdata/hf_parity/README.md describes the files; regenerate them with

    ATEN_CPU_CAPABILITY=avx2 .venv/bin/python tools/scripts/hf_parity.py record --out=testdata/hf_parity

`check-export` loads a directory in the Hugging Face layout (e.g. Keel's export of a fixture's
weights) with from_pretrained (float32, eager attention), runs the input_ids of an expected.safetensors
and compares the logits with its `logits`:

    .venv/bin/python tools/scripts/hf_parity.py check-export --dir=runs/export \\
        --expected=testdata/hf_parity/llama_tied/expected.safetensors --tolerance=1e-5

It prints one JSON line ({"max_abs_diff": ..., "ok": ...}) and exits 0 when max |diff| <= tolerance,
1 when not (or when transformers left a weight uninitialised or the logits have the wrong shape),
and 2 when it cannot compare (a missing or unreadable file, an expected file without the keys).

`check-eval` loads a directory in the Hugging Face layout with from_pretrained and computes, over the
indexed dataset PREFIX (.bin/.idx, tokens end to end), the per-window losses that `tools:eval` printed
into KEEL_JSONL (window i = tokens [i*L, i*L+L+1)), and compares them, window by window and the mean;
with --adapter=PEFT_DIR, over the peft adapter loaded with PeftModel.from_pretrained (tools:eval's
--adapter):

    .venv/bin/python tools/scripts/hf_parity.py check-eval --dir=runs/export --data_prefix=data/text \
        --sequence_length=16 --keel=eval.jsonl --tolerance=1e-5

Its JSON line and exit codes are check-export's.

`check-peft` loads a base model with from_pretrained and a peft adapter directory over it with
PeftModel.from_pretrained (e.g. Keel's export of a LoRA checkpoint), runs the input_ids of an
expected.safetensors and compares the logits with its `logits`; with --merged instead of --adapter it
loads a merged model (Keel's `ckpt export-safetensors --merge`) as check-export does:

    .venv/bin/python tools/scripts/hf_parity.py check-peft --base=testdata/hf_parity/llama_gqa_untied \
        --adapter=runs/adapter --expected=runs/expected.safetensors --tolerance=1e-5

Its JSON line and exit codes are check-export's; an adapter file whose tensors peft does not take, or
that leaves an adapter of the model unset, exits 1 (`missing_keys`/`unexpected_keys` in the line).

Needs torch 2.11.0, transformers 5.24.0, safetensors 0.8.0 and peft 0.21.2 (tools/bootstrap.sh puts them
in .venv).
"""

import argparse
import dataclasses
import json
import math
import os
import shutil
import sys
from typing import Callable, Dict, List, Optional

try:
    import safetensors
    import safetensors.torch
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    import megatron_indexed  # beside this script
    import peft
    from peft import LoraConfig, PeftModel, get_peft_model
    from peft.utils import get_peft_model_state_dict
except ImportError as e:  # pragma: no cover - environment problem, reported plainly
    print(f"hf_parity: {e}; this script needs torch, transformers, safetensors and peft "
          "(run tools/bootstrap.sh and use .venv/bin/python)", file=sys.stderr)
    sys.exit(2)
if not hasattr(peft, "__version__"):  # Keel's C++ peft/ folder, found on sys.path before the package
    print(f"hf_parity: 'import peft' found {list(getattr(peft, '__path__', []))}, not Hugging Face peft; "
          "run the script by its path (not with -c or -m) from any directory, or with python -P", file=sys.stderr)
    sys.exit(2)

BATCH = 2
SEQ = 17
SGD_LR = 0.1
# HF-style labels: positions set to -100 (input_ids elsewhere). (0, 0) is dropped by the shift anyway;
# the others remove real targets, one of them the last target of a row.
IGNORED_LABELS = ((0, 0), (0, 7), (1, 12), (1, 16))
# The files `record` writes into a case directory, and the only ones it will delete there.
CASE_FILES = ("config.json", "model.safetensors", "expected.safetensors")
_SAVE_PRETRAINED_EXTRAS = ("generation_config.json",)

# The shapes shared by every case; a case adds or overrides fields.
_COMMON = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
               vocab_size=131, max_position_embeddings=64, rms_norm_eps=1e-5, attention_dropout=0.0)
_LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 4.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8}


@dataclasses.dataclass(frozen=True)
class AdapterCase:
    """A LoRA adapter recorded with peft on the model of the case `base` (recorded first, or already in OUT)."""
    name: str
    base: str
    seed: int
    description: str
    r: int
    lora_alpha: int
    lora_dropout: float
    target_modules: tuple


ADAPTER_CASES = (
    AdapterCase("llama_gqa_untied_lora", "llama_gqa_untied", 1101,
                "LoRA r 4, lora_alpha 8 (scale 2) on q_proj, v_proj (column-parallel in Keel) and down_proj "
                "(row-parallel) of llama_gqa_untied; A and B seeded random",
                r=4, lora_alpha=8, lora_dropout=0.05, target_modules=("q_proj", "v_proj", "down_proj")),
)
# The files `record` writes into an adapter case directory, and the only ones it will delete there.
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "expected.safetensors")
_SAVE_ADAPTER_EXTRAS = ("README.md",)


class ParityError(Exception):
    """transformers did not do what a fixture relies on; nothing written may be trusted."""


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    seed: int
    description: str
    make_config: Callable[[], transformers.PreTrainedConfig]
    # "rope_parameters" (transformers v5, as save_pretrained writes it) or "legacy" (v4's top-level
    # rope_theta plus rope_scaling, written over config.json after save_pretrained).
    config_spelling: str = "rope_parameters"


CASES = (
    Case("llama_tied", 1001, "Llama, MHA (4 kv heads), tied embeddings, default RoPE theta 1e4",
         lambda: LlamaConfig(**_COMMON, num_key_value_heads=4, tie_word_embeddings=True,
                             rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    Case("llama_gqa_untied", 1002,
         "Llama, GQA (2 kv heads), head_dim 24 != 64/4, untied, llama3 RoPE theta 5e5 factor 4 "
         "original_max_position_embeddings 8 < sequence 17",
         lambda: LlamaConfig(**_COMMON, num_key_value_heads=2, head_dim=24, tie_word_embeddings=False,
                             attention_bias=False, mlp_bias=False, rope_parameters=dict(_LLAMA3_ROPE))),
    Case("llama_legacy_rope", 1003,
         "llama_gqa_untied's configuration (other weights) with config.json in the transformers v4 "
         "spelling: top-level rope_theta plus rope_scaling, no rope_parameters",
         lambda: LlamaConfig(**_COMMON, num_key_value_heads=2, head_dim=24, tie_word_embeddings=False,
                             attention_bias=False, mlp_bias=False, rope_parameters=dict(_LLAMA3_ROPE)),
         config_spelling="legacy"),
    Case("qwen2", 1004, "Qwen2, GQA (2 kv heads), tied, q/k/v biases (o_proj has none), RoPE theta 1e6",
         lambda: Qwen2Config(**_COMMON, num_key_value_heads=2, tie_word_embeddings=True,
                             rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    Case("qwen3", 1005,
         "Qwen3, GQA (2 kv heads), head_dim 24 (the class default is 128), untied, q_norm/k_norm over "
         "the head dim before RoPE, RoPE theta 1e6",
         lambda: Qwen3Config(**_COMMON, num_key_value_heads=2, head_dim=24, tie_word_embeddings=False,
                             rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    Case("mistral", 1006, "Mistral, GQA (2 kv heads), sliding_window 8 < sequence 17, untied, RoPE theta 1e4",
         lambda: MistralConfig(**_COMMON, num_key_value_heads=2, sliding_window=8, tie_word_embeddings=False,
                               rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
)


def _build(config) -> torch.nn.Module:
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    model.eval()  # no dropout anywhere (attention_dropout is 0 as well)
    return model


def _load(directory: str) -> torch.nn.Module:
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    return model


def perturb(model: torch.nn.Module, generator: torch.Generator) -> Dict[str, str]:
    """Overwrites every parameter, in named_parameters order, from `generator`; returns name -> rule.

    Norm weights (input/post_attention/final and Qwen3's q_norm/k_norm) become 1 + 0.1*randn, biases
    0.1*randn, embeddings 0.25*randn and every other matrix randn/sqrt(in_features), so activations stay
    near unit scale and attention is far from uniform. Unknown parameter kinds are refused.
    """
    rules = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator, dtype=torch.float32)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * noise)
                rules[name] = "1+0.1*randn"
            elif name.endswith(".bias"):
                p.copy_(0.1 * noise)
                rules[name] = "0.1*randn"
            elif name.endswith("embed_tokens.weight"):
                p.copy_(0.25 * noise)
                rules[name] = "0.25*randn"
            elif name.endswith("_proj.weight") or name == "lm_head.weight":
                p.copy_(noise / math.sqrt(p.shape[1]))
                rules[name] = f"randn/sqrt({p.shape[1]})"
            else:
                raise ParityError(f"parameter {name} {tuple(p.shape)} has no perturbation rule; add one")
    return rules


def make_inputs(vocab_size: int, generator: torch.Generator):
    input_ids = torch.randint(0, vocab_size, (BATCH, SEQ), generator=generator, dtype=torch.int64)
    input_ids[0, 3] = vocab_size - 1
    input_ids[1, 9] = 0
    input_ids[1, 15] = vocab_size - 1
    labels = input_ids.clone()
    for row, col in IGNORED_LABELS:
        labels[row, col] = -100
    return input_ids, labels


def forward_with_hidden(model, input_ids):
    """Logits, and the residual stream: [embeddings, output of layer 0, ..., of the last layer]."""
    captured: List[torch.Tensor] = []

    def hook(_module, _inputs, output):
        captured.append((output[0] if isinstance(output, tuple) else output).detach().clone())

    handles = [model.model.embed_tokens.register_forward_hook(hook)]
    handles += [layer.register_forward_hook(hook) for layer in model.model.layers]
    try:
        with torch.no_grad():
            logits = model(input_ids=input_ids).logits.detach().clone()
    finally:
        for h in handles:
            h.remove()
    if len(captured) != len(model.model.layers) + 1:
        raise ParityError(f"captured {len(captured)} hidden states, expected {len(model.model.layers) + 1}")
    return logits, torch.stack(captured)


def _logits(model, input_ids) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=input_ids).logits.detach().clone()


def _require_equal(what: str, actual: torch.Tensor, expected: torch.Tensor) -> None:
    if actual.shape != expected.shape or not torch.equal(actual, expected):
        diff = ((actual - expected).abs().max().item() if actual.shape == expected.shape
                else f"shape {tuple(actual.shape)} vs {tuple(expected.shape)}")
        raise ParityError(f"{what}: not bitwise equal (max |diff| {diff})")


def save_file_stable(tensors: Dict[str, torch.Tensor], path: str, metadata: Dict[str, str]) -> None:
    """safetensors.torch.save_file with the metadata keys sorted, so that a rerun writes the same bytes.

    The library serialises __metadata__ from a hash map, in a different order on every run. The header
    is rewritten in place with the same length (safetensors pads it with spaces), and read back.
    """
    blob = safetensors.torch.save(tensors, metadata=metadata)
    size = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + size])
    header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
    text = json.dumps(header, separators=(",", ":")).encode()
    if len(text) > size:
        raise ParityError(f"{path}: re-serialised safetensors header grew from {size} to {len(text)} bytes")
    stable = blob[:8] + text + b" " * (size - len(text)) + blob[8 + size:]
    reread = safetensors.torch.load(stable)
    if reread.keys() != tensors.keys() or not all(torch.equal(reread[k], tensors[k]) for k in tensors):
        raise ParityError(f"{path}: tensors changed when the safetensors header was rewritten")
    with open(path, "wb") as f:
        f.write(stable)


def rewrite_config_legacy(path: str) -> dict:
    """Rewrites config.json from v5's rope_parameters to v4's rope_theta + rope_scaling; returns it."""
    with open(path) as f:
        config = json.load(f)
    if "rope_parameters" not in config or "rope_scaling" in config or "rope_theta" in config:
        raise ParityError(f"{path}: expected transformers to write rope_parameters only, found keys "
                          f"{sorted(k for k in config if k.startswith('rope'))}")
    rope = dict(config.pop("rope_parameters"))
    config["rope_theta"] = rope.pop("rope_theta")
    config["rope_scaling"] = rope
    with open(path, "w") as f:
        f.write(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return config


def check_sliding_window(model, config, input_ids, logits) -> Dict[str, str]:
    """Shows that eager attention applies Mistral's window, and pins its width.

    With window w, query q must see keys k with q - w < k <= q: logits at positions < w equal those of
    the same weights without a window and differ after; with window w + 1, position w differs.
    """
    w = config.sliding_window
    state = model.state_dict()
    variants = {}
    for label, window in (("none", None), ("wider", w + 1)):
        other_config = config.__class__.from_dict(config.to_dict())
        other_config.sliding_window = window
        other = _build(other_config)
        other.load_state_dict(state)
        variants[label] = _logits(other, input_ids)
    full, wider = variants["none"], variants["wider"]
    if not torch.equal(full[:, :w], logits[:, :w]):
        raise ParityError(f"sliding_window {w}: logits before position {w} differ from full attention's")
    after = (full[:, w:] - logits[:, w:]).abs().max().item()
    if after < 1e-3:
        raise ParityError(f"sliding_window {w} is not applied by eager attention in transformers "
                          f"{transformers.__version__} (max |diff| after position {w}: {after})")
    if not torch.equal(wider[:, :w], logits[:, :w]) or torch.equal(wider[:, w], logits[:, w]):
        raise ParityError(f"sliding_window {w}: window width is not q - {w} < k <= q")
    return {"sliding_window_applied": "true",
            "sliding_window_semantics": f"query q attends keys k with q - {w} < k <= q ({w} keys at most)",
            "sliding_window_max_abs_diff_vs_full_attention": repr(after)}


def _clear_case_dir(case_dir: str, files=CASE_FILES + _SAVE_PRETRAINED_EXTRAS) -> None:
    if not os.path.isdir(case_dir):
        return
    stray = sorted(set(os.listdir(case_dir)) - set(files))
    if stray:
        raise ParityError(f"{case_dir} holds files record does not write ({', '.join(stray)}); "
                          "move them away or choose another --out")
    shutil.rmtree(case_dir)


def record_case(case: Case, out: str) -> Dict[str, int]:
    """Writes OUT/<case>/ and verifies it; returns the file sizes."""
    case_dir = os.path.join(out, case.name)
    _clear_case_dir(case_dir)

    torch.manual_seed(case.seed)  # transformers' own init; perturb() overwrites all of it
    config = case.make_config()
    model = _build(config)
    generator = torch.Generator().manual_seed(case.seed)
    perturb(model, generator)
    input_ids, labels = make_inputs(config.vocab_size, generator)

    logits, hidden_states = forward_with_hidden(model, input_ids)
    model.zero_grad(set_to_none=True)
    output = model(input_ids=input_ids, labels=labels)
    _require_equal(f"{case.name}: logits with labels", output.logits.detach(), logits)
    loss = output.loss.detach().clone()
    # The convention the files document: shift inside, mean over the targets that are not -100.
    manual = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, config.vocab_size),
                                               labels[:, 1:].reshape(-1), ignore_index=-100)
    if not torch.allclose(manual, loss, rtol=1e-6, atol=0):
        raise ParityError(f"{case.name}: HF loss {loss.item()} is not the shifted mean {manual.item()}")
    output.loss.backward()
    grads = {}
    for name, p in model.named_parameters():
        if p.grad is None:
            raise ParityError(f"{case.name}: {name} got no gradient")
        grads[f"grad.{name}"] = p.grad.detach().clone()
    tied = getattr(model, "lm_head", None) is not None and \
        model.lm_head.weight is model.model.embed_tokens.weight
    if tied != bool(config.tie_word_embeddings):
        raise ParityError(f"{case.name}: lm_head tied={tied}, config says {config.tie_word_embeddings}")
    weights_before = {k: v.detach().clone() for k, v in model.state_dict().items()}

    metadata = {
        "case": case.name,
        "description": case.description,
        "seed": str(case.seed),
        "config_spelling": case.config_spelling,
        "model_class": type(model).__name__,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "safetensors_version": safetensors.__version__,
        "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_num_threads": str(torch.get_num_threads()),
        "attn_implementation": model.config._attn_implementation,
        "dtype": "float32",
        "sgd_lr": repr(SGD_LR),
        "loss": "transformers ForCausalLMLoss: labels shifted inside, mean over targets != -100",
        "hidden_states": "[embeddings, output of layer 0, ..., output of the last layer], "
                         "before the final norm",
        "tied_word_embeddings": json.dumps(tied),
    }
    if isinstance(config, MistralConfig):
        metadata.update(check_sliding_window(model, config, input_ids, logits))

    model.save_pretrained(case_dir, safe_serialization=True)
    for extra in _SAVE_PRETRAINED_EXTRAS:  # not read by the parity tests; keep the case minimal
        extra_path = os.path.join(case_dir, extra)
        if os.path.exists(extra_path):
            os.remove(extra_path)
    written = sorted(os.listdir(case_dir))
    if written != ["config.json", "model.safetensors"]:
        raise ParityError(f"{case_dir}: save_pretrained wrote {written}, "
                          "expected config.json and model.safetensors")

    optimizer = torch.optim.SGD(model.parameters(), lr=SGD_LR)
    optimizer.step()
    with torch.no_grad():
        after = model(input_ids=input_ids, labels=labels)
    loss_after, logits_after = after.loss.detach().clone(), after.logits.detach().clone()

    tensors = {"input_ids": input_ids, "labels": labels, "logits": logits, "loss": loss,
               "hidden_states": hidden_states, "loss_after_step": loss_after,
               "logits_after_step": logits_after, **grads}
    save_file_stable({k: v.contiguous() for k, v in tensors.items()},
                     os.path.join(case_dir, "expected.safetensors"), metadata)

    if case.config_spelling == "legacy":
        rewrite_config_legacy(os.path.join(case_dir, "config.json"))

    # What a consumer gets back: the same weights, the same RoPE parameters, bitwise the same logits.
    loaded = _load(case_dir)
    loaded_state = loaded.state_dict()
    for name, value in weights_before.items():
        if "rotary_emb" in name:
            continue
        _require_equal(f"{case.name}: reloaded {name}", loaded_state[name], value)
    if loaded.config.rope_parameters != config.rope_parameters:
        raise ParityError(f"{case.name}: reloaded rope_parameters {loaded.config.rope_parameters} "
                          f"!= {config.rope_parameters}")
    _require_equal(f"{case.name}: logits of from_pretrained({case_dir})", _logits(loaded, input_ids), logits)
    return {f: os.path.getsize(os.path.join(case_dir, f)) for f in sorted(os.listdir(case_dir))}


def _peft_logits(model, input_ids) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=input_ids).logits.detach().clone()


def _adapter_state(model) -> Dict[str, torch.Tensor]:
    """The adapter's tensors under the keys save_pretrained writes (base_model.model.<module>.lora_A.weight)."""
    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}


def write_adapter_config(path: str, edits: Dict) -> None:
    """Rewrites adapter_config.json with `edits` applied, as peft writes it (indent 2, keys sorted)."""
    with open(path) as f:
        config = json.load(f)
    config.update(edits)
    with open(path, "w") as f:
        f.write(json.dumps(config, indent=2, sort_keys=True) + "\n")


def record_adapter_case(case: AdapterCase, out: str) -> Dict[str, int]:
    """Writes OUT/<adapter case>/ from OUT/<base>/ and verifies it; returns the file sizes."""
    base_dir = os.path.join(out, case.base)
    case_dir = os.path.join(out, case.name)
    _clear_case_dir(case_dir, ADAPTER_FILES + _SAVE_ADAPTER_EXTRAS)
    input_ids, base_logits, _ = _read_expected(os.path.join(base_dir, "expected.safetensors"))

    torch.manual_seed(case.seed)  # peft's own initialisation, all of it overwritten below
    config = LoraConfig(r=case.r, lora_alpha=case.lora_alpha, lora_dropout=case.lora_dropout,
                        target_modules=list(case.target_modules), task_type="CAUSAL_LM")
    model = get_peft_model(_load(base_dir), config)
    model.eval()  # no dropout: the logits are the adapter's, deterministically
    generator = torch.Generator().manual_seed(case.seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_A." in name or ".lora_B." in name:  # [r, in] and [out, r], unit-scale products
                p.copy_(torch.randn(p.shape, generator=generator) / math.sqrt(p.shape[1]))
    logits = _peft_logits(model, input_ids)
    moved = (logits - base_logits).abs().max().item()
    if moved < 1e-2:
        raise ParityError(f"{case.name}: the adapter moves the logits by {moved} only")
    adapter = _adapter_state(model)
    model.save_pretrained(case_dir)
    merged_logits = _peft_logits(model.merge_and_unload(), input_ids)
    for extra in _SAVE_ADAPTER_EXTRAS:
        extra_path = os.path.join(case_dir, extra)
        if os.path.exists(extra_path):
            os.remove(extra_path)
    # peft writes target_modules from a set (its order depends on the hash seed) and the base's
    # absolute path; make both stable.
    write_adapter_config(os.path.join(case_dir, "adapter_config.json"),
                         {"target_modules": sorted(case.target_modules),
                          "base_model_name_or_path": f"testdata/hf_parity/{case.base}"})
    written = sorted(os.listdir(case_dir))
    if written != ["adapter_config.json", "adapter_model.safetensors"]:
        raise ParityError(f"{case_dir}: save_pretrained wrote {written}, "
                          "expected adapter_config.json and adapter_model.safetensors")

    metadata = {
        "case": case.name,
        "base": case.base,
        "description": case.description,
        "seed": str(case.seed),
        "r": str(case.r),
        "lora_alpha": str(case.lora_alpha),
        "transformers_version": transformers.__version__,
        "peft_version": peft.__version__,
        "torch_version": torch.__version__,
        "safetensors_version": safetensors.__version__,
        "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_num_threads": str(torch.get_num_threads()),
        "attn_implementation": "eager",
        "dtype": "float32",
        "logits": "PeftModel.from_pretrained(base, adapter) in eval mode",
        "merged_logits": "the same model's merge_and_unload()",
    }
    save_file_stable({"input_ids": input_ids, "logits": logits, "merged_logits": merged_logits},
                     os.path.join(case_dir, "expected.safetensors"), metadata)

    # What a consumer gets back: the same adapter, bitwise the same logits, and the merge close to them.
    loaded = PeftModel.from_pretrained(_load(base_dir), case_dir)
    loaded.eval()
    loaded_adapter = _adapter_state(loaded)
    if loaded_adapter.keys() != adapter.keys():
        raise ParityError(f"{case.name}: reloaded adapter keys {sorted(loaded_adapter)} != {sorted(adapter)}")
    for key, value in adapter.items():
        _require_equal(f"{case.name}: reloaded {key}", loaded_adapter[key], value)
    _require_equal(f"{case.name}: logits of PeftModel.from_pretrained", _peft_logits(loaded, input_ids), logits)
    merge_diff = (merged_logits - logits).abs().max().item()
    if merge_diff > 1e-5:
        raise ParityError(f"{case.name}: merge_and_unload() moves the logits by {merge_diff}")
    return {f: os.path.getsize(os.path.join(case_dir, f)) for f in sorted(os.listdir(case_dir))}


# A tiny chat tokenizer and conversations for supervised fine-tuning (issue 44): OUT/<sft case>/.
# Special tokens first, then the template's markers (added tokens), then every word of the
# conversations in sorted order; the vocabulary fits the base case's 131 ids.
_SFT_SPECIAL = ("<unk>", "<s>", "</s>", "<pad>")
_SFT_MARKERS = ("[INST]", "[/INST]", "<<SYS>>", "<</SYS>>", "<think>", "</think>")


def _sft_template(generation: bool) -> str:
    """A Llama-2-like template: the assistant's message (its text and EOS) is all the model writes,
    so the {% generation %} blocks and the renders of message prefixes mark the same tokens."""
    open_, close = ("{% generation %}", "{% endgeneration %}") if generation else ("", "")
    return ("{{ bos_token }}{% for m in messages %}"
            "{% if m['role'] == 'system' %}<<SYS>>{{ m['content'] }}<</SYS>>"
            "{% elif m['role'] == 'user' %}[INST]{{ m['content'] }}[/INST]"
            "{% elif m['role'] == 'assistant' %}" + open_ + "{{ m['content'] }}{{ eos_token }}" + close +
            "{% endif %}{% endfor %}")


# Qwen3's habit in miniature: an assistant message before the last user message loses its
# <think>...</think>, so rendering a prefix does not reproduce the start of the whole render.
_SFT_REWRITING_TEMPLATE = (
    "{{ bos_token }}{% set ns = namespace(last_user=-1) %}{% for m in messages %}"
    "{% if m['role'] == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}"
    "{% for m in messages %}{% if m['role'] == 'system' %}<<SYS>>{{ m['content'] }}<</SYS>>"
    "{% elif m['role'] == 'user' %}[INST]{{ m['content'] }}[/INST]"
    "{% elif loop.index0 < ns.last_user and '</think>' in m['content'] %}"
    "{{ m['content'].split('</think>')[-1] }}{{ eos_token }}"
    "{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}")


@dataclasses.dataclass(frozen=True)
class SftCase:
    """A chat tokenizer, conversations and transformers' answer-only loss on the model of `base`."""
    name: str
    base: str
    description: str
    conversations: tuple  # OpenAI messages lists
    # The prompt/completion row (AutoModel's context/question/answer) recorded without a template.
    prompt_completion: tuple  # (context, question, answer)


def _sys(text): return {"role": "system", "content": text}
def _user(text): return {"role": "user", "content": text}
def _assistant(text): return {"role": "assistant", "content": text}


SFT_CASES = (
    SftCase("llama_gqa_untied_sft", "llama_gqa_untied",
            "a WordLevel chat tokenizer (Llama-2-like template with {% generation %}) and four conversations "
            "on llama_gqa_untied: transformers' assistant masks and answer-only loss",
            conversations=(
                (_sys("You are terse."), _user("What is two plus two?"), _assistant("Four."),
                 _user("And three plus three?"), _assistant("Six.")),
                (_user("Say hi"), _assistant("Hi!")),
                (_sys("The cat sat on the mat."), _user("Where did the cat sit?"), _assistant("On the mat.")),
                (_user("What is two plus two?"), _assistant("<think>two and two</think>Four."),
                 _user("Say hi"), _assistant("Hi!")),
            ),
            prompt_completion=("The cat sat on the mat.", "Where did the cat sit?", "On the mat.")),
)
SFT_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "prefix_template.jinja",
             "rewriting_template.jinja", "conversations.jsonl", "expected.safetensors")


def _sft_tokenizer(case: SftCase):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    pre = pre_tokenizers.Whitespace()
    texts = [m["content"] for c in case.conversations for m in c] + list(case.prompt_completion)
    for marker in _SFT_MARKERS:
        texts = [t.replace(marker, " ") for t in texts]
    words = sorted({piece for t in texts for piece, _ in pre.pre_tokenize_str(t)})
    vocab = {token: i for i, token in enumerate(_SFT_SPECIAL + _SFT_MARKERS + tuple(words))}
    word_level = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    word_level.pre_tokenizer = pre
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=word_level, unk_token="<unk>", bos_token="<s>",
                                        eos_token="</s>", pad_token="<pad>",
                                        additional_special_tokens=list(_SFT_MARKERS))
    tokenizer.chat_template = _sft_template(generation=True)
    return tokenizer


def record_sft_case(case: SftCase, out: str) -> Dict[str, int]:
    """Writes OUT/<sft case>/ from OUT/<base>/ and verifies it; returns the file sizes."""
    from transformers import AutoTokenizer
    case_dir = os.path.join(out, case.name)
    _clear_case_dir(case_dir, SFT_FILES)
    tokenizer = _sft_tokenizer(case)
    model = _load(os.path.join(out, case.base))
    if len(tokenizer) > model.config.vocab_size:
        raise ParityError(f"{case.name}: the tokenizer has {len(tokenizer)} ids, the model {model.config.vocab_size}")
    tokenizer.save_pretrained(case_dir)
    written = sorted(os.listdir(case_dir))
    if written != ["chat_template.jinja", "tokenizer.json", "tokenizer_config.json"]:
        raise ParityError(f"{case_dir}: save_pretrained wrote {written}")
    for name, text in (("prefix_template.jinja", _sft_template(generation=False)),
                       ("rewriting_template.jinja", _SFT_REWRITING_TEMPLATE)):
        with open(os.path.join(case_dir, name), "w") as f:
            f.write(text)
    with open(os.path.join(case_dir, "conversations.jsonl"), "w") as f:
        for messages in case.conversations:
            f.write(json.dumps({"messages": list(messages)}) + "\n")

    loaded = AutoTokenizer.from_pretrained(case_dir, local_files_only=True)
    rendered = [loaded.apply_chat_template(list(c), tokenize=True, return_dict=True,
                                           return_assistant_tokens_mask=True) for c in case.conversations]
    ids = [torch.tensor(r["input_ids"], dtype=torch.int64) for r in rendered]
    masks = [torch.tensor(r["assistant_masks"], dtype=torch.int64) for r in rendered]
    lengths = torch.tensor([len(i) for i in ids], dtype=torch.int64)
    width = int(lengths.max())
    pad = loaded.pad_token_id

    def padded(rows, value):
        return torch.stack([torch.nn.functional.pad(r, (0, width - len(r)), value=value) for r in rows])

    loss_sums, label_tokens = [], []
    for i, (row, mask) in enumerate(zip(ids, masks)):
        labels = torch.where(mask.bool(), row, torch.full_like(row, -100))
        with torch.no_grad():
            output = model(input_ids=row[None], labels=labels[None])
        targets = labels[1:]
        total = torch.nn.functional.cross_entropy(output.logits[0, :-1], targets, ignore_index=-100,
                                                  reduction="sum")
        count = int((targets != -100).sum())
        if count == 0 or not torch.allclose(total / count, output.loss, rtol=1e-6, atol=0):
            raise ParityError(f"{case.name}: conversation {i}: HF loss {output.loss.item()} is not the mean "
                              f"{total.item()}/{count} of its shifted learned targets")
        loss_sums.append(total)
        label_tokens.append(count)
    loss_sum = torch.stack(loss_sums)
    label_tokens = torch.tensor(label_tokens, dtype=torch.int64)

    context, question, answer = case.prompt_completion
    prompt = f"{context} {question} "
    plain = loaded(prompt + answer)["input_ids"] + [loaded.eos_token_id]
    plain_prompt = len(loaded(prompt, add_special_tokens=False)["input_ids"])
    metadata = {
        "case": case.name,
        "base": case.base,
        "description": case.description,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_num_threads": str(torch.get_num_threads()),
        "attn_implementation": "eager",
        "dtype": "float32",
        "assistant_masks": "apply_chat_template(return_assistant_tokens_mask=True) with chat_template.jinja",
        "labels": "input_ids with -100 where assistant_masks is 0 (and on padding), unshifted",
        "loss_sum": "per conversation, alone (no padding): the summed cross-entropy of its shifted learned "
                    "targets, logits[:-1] against labels[1:]",
        "loss": "sum(loss_sum) / sum(label_tokens), AutoModel's MaskedCrossEntropy over num_label_tokens",
        "prompt_completion": "AutoModel's plain format: tokenizer('context question ' + answer) + [EOS]; "
                             "the first prompt_completion_prompt_tokens are not learned",
    }
    tensors = {
        "input_ids": padded(ids, pad), "lengths": lengths, "assistant_masks": padded(masks, 0),
        "labels": padded([torch.where(m.bool(), r, torch.full_like(r, -100)) for r, m in zip(ids, masks)], -100),
        "loss_sum": loss_sum, "label_tokens": label_tokens,
        "loss": (loss_sum.sum() / label_tokens.sum()).to(torch.float32),
        "prompt_completion_ids": torch.tensor(plain, dtype=torch.int64),
        "prompt_completion_prompt_tokens": torch.tensor(plain_prompt, dtype=torch.int64),
    }
    save_file_stable(tensors, os.path.join(case_dir, "expected.safetensors"), metadata)
    if sorted(os.listdir(case_dir)) != sorted(SFT_FILES):
        raise ParityError(f"{case_dir}: holds {sorted(os.listdir(case_dir))}, expected {sorted(SFT_FILES)}")
    for i, (row, mask) in enumerate(zip(ids, masks)):
        if not (mask.any() and (mask == 0).any()):
            raise ParityError(f"{case.name}: conversation {i}: the mask {mask.tolist()} learns all or nothing")
    return {f: os.path.getsize(os.path.join(case_dir, f)) for f in sorted(os.listdir(case_dir))}


def cmd_record(args) -> int:
    torch.set_num_threads(args.threads)
    names = [c.name for c in CASES] + [c.name for c in ADAPTER_CASES] + [c.name for c in SFT_CASES]
    unknown = sorted(set(args.case or ()) - set(names))
    if unknown:
        print(f"hf_parity: unknown --case {', '.join(unknown)}; cases are {', '.join(names)}", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    recorders = [(c, record_case) for c in CASES] + [(c, record_adapter_case) for c in ADAPTER_CASES] + \
        [(c, record_sft_case) for c in SFT_CASES]
    for case, recorder in recorders:
        if args.case and case.name not in args.case:
            continue
        try:
            sizes = recorder(case, args.out)
        except ParityError as e:
            print(f"hf_parity: record failed: {e}", file=sys.stderr)
            return 1
        print(f"{case.name}: " + ", ".join(f"{f} {n} B" for f, n in sizes.items()))
    return 0


class BadInput(Exception):
    """check-export cannot compare: a file is missing or unreadable, or a key is wrong."""


def _read_expected(path: str):
    if not os.path.isfile(path):
        raise BadInput(f"--expected={path}: no such file")
    try:
        tensors = safetensors.torch.load_file(path)
        with safetensors.safe_open(path, framework="pt") as f:
            metadata = f.metadata() or {}
    except Exception as e:  # safetensors raises its own error types for bad headers
        raise BadInput(f"--expected={path}: not a readable safetensors file ({e})")
    for key, dtype, ndim in (("input_ids", torch.int64, 2), ("logits", torch.float32, 3)):
        if key not in tensors:
            raise BadInput(f"--expected={path}: no key '{key}' (has {', '.join(sorted(tensors)[:8])}...)")
        if tensors[key].dtype != dtype or tensors[key].dim() != ndim:
            raise BadInput(f"--expected={path}: '{key}' is {tensors[key].dtype} {tuple(tensors[key].shape)}, "
                           f"expected {dtype} with {ndim} dimensions")
    if tensors["input_ids"].shape != tensors["logits"].shape[:2]:
        raise BadInput(f"--expected={path}: input_ids {tuple(tensors['input_ids'].shape)} do not match "
                       f"logits {tuple(tensors['logits'].shape)}")
    return tensors["input_ids"], tensors["logits"], metadata


def _finish(code, **result) -> int:
    print(json.dumps(result, sort_keys=True))
    return code


def _check_tolerance(args) -> bool:
    if not (args.tolerance >= 0 and math.isfinite(args.tolerance)):
        print(f"hf_parity: --tolerance={args.tolerance} must be a finite number >= 0", file=sys.stderr)
        return False
    return True


def _load_hf_dir(flag: str, directory: str):
    """from_pretrained of a directory in the Hugging Face layout, with its loading info."""
    if not os.path.isdir(directory):
        raise BadInput(f"{flag}={directory}: no such directory")
    if not os.path.isfile(os.path.join(directory, "config.json")):
        raise BadInput(f"{flag}={directory}: no config.json")
    try:
        return AutoModelForCausalLM.from_pretrained(
            directory, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    except Exception as e:
        raise BadInput(f"{flag}={directory}: transformers cannot load it: {type(e).__name__}: {e}")


def _warn_kernels(expected_path: str, metadata) -> None:
    recorded, current = metadata.get("aten_cpu_capability"), torch.backends.cpu.get_cpu_capability()
    if recorded and recorded != current:  # kernels differ by a few ulps (1.7e-6 on these logits)
        print(f"hf_parity: {expected_path} was recorded with {recorded} kernels, this run "
              f"uses {current}; set ATEN_CPU_CAPABILITY={recorded.lower()} for bitwise agreement",
              file=sys.stderr)


def _compare_logits(model, input_ids, expected, tolerance: float, problems) -> int:
    """The JSON line and exit code of a check: `problems` (keys left uninitialised), then the logits."""
    model.eval()
    problems = {k: [str(x) for x in sorted(v)] for k, v in problems.items() if v}
    if problems:  # weights left at their initial values: the export is incomplete
        return _finish(1, max_abs_diff=None, ok=False, **problems)
    if input_ids.max().item() >= model.config.vocab_size:
        return _finish(1, max_abs_diff=None, ok=False,
                       error=f"vocab_size {model.config.vocab_size} <= largest input id "
                             f"{input_ids.max().item()}")
    actual = _logits(model, input_ids)
    if actual.shape != expected.shape:
        return _finish(1, max_abs_diff=None, ok=False,
                       error=f"logits shape {list(actual.shape)} != expected {list(expected.shape)}")
    diff = (actual - expected).abs().max().item()
    ok = math.isfinite(diff) and diff <= tolerance
    result = {"max_abs_diff": diff if math.isfinite(diff) else None, "ok": ok}
    if not math.isfinite(diff):
        result["error"] = "logits are not finite"
    return _finish(0 if ok else 1, **result)


def cmd_check_export(args) -> int:
    if not _check_tolerance(args):
        return 2
    torch.set_num_threads(args.threads)
    try:
        input_ids, expected, metadata = _read_expected(args.expected)
        model, info = _load_hf_dir("--dir", args.dir)
    except BadInput as e:
        print(f"hf_parity: check-export: {e}", file=sys.stderr)
        return _finish(2, error=str(e), max_abs_diff=None, ok=False)
    _warn_kernels(args.expected, metadata)
    return _compare_logits(model, input_ids, expected, args.tolerance,
                           {k: info.get(k) or [] for k in ("missing_keys", "mismatched_keys")})


def _load_peft(base: str, adapter: str):
    """PeftModel.from_pretrained(base, adapter), and the adapter keys it left unset or did not take."""
    model, info = _load_hf_dir("--base", base)
    if any(info.get(k) for k in ("missing_keys", "mismatched_keys")):
        raise BadInput(f"--base={base}: transformers left weights uninitialised: "
                       f"{info.get('missing_keys') or info.get('mismatched_keys')}")
    weights = os.path.join(adapter, "adapter_model.safetensors")
    for path in (os.path.join(adapter, "adapter_config.json"), weights):
        if not os.path.isfile(path):
            raise BadInput(f"--adapter={adapter}: no {os.path.basename(path)}")
    try:
        in_file = safetensors.torch.load_file(weights)
        model = PeftModel.from_pretrained(model, adapter)
    except Exception as e:
        raise BadInput(f"--adapter={adapter}: peft cannot load it: {type(e).__name__}: {e}")
    # peft only warns about keys; compare what it holds with the file, key by key and value by value.
    held = _adapter_state(model)
    problems = {"missing_keys": sorted(set(held) - set(in_file)),
                "unexpected_keys": sorted(set(in_file) - set(held)),
                "mismatched_keys": sorted(k for k in set(held) & set(in_file)
                                          if not torch.equal(held[k], in_file[k].to(held[k].dtype)))}
    return model, problems


def cmd_check_peft(args) -> int:
    if not _check_tolerance(args):
        return 2
    torch.set_num_threads(args.threads)
    try:
        if (args.adapter is None) == (args.merged is None):
            raise BadInput("give exactly one of --adapter (with --base) and --merged")
        if args.adapter is not None and args.base is None:
            raise BadInput("--adapter needs --base, the model it adapts")
        input_ids, expected, metadata = _read_expected(args.expected)
        if args.adapter is not None:
            model, problems = _load_peft(args.base, args.adapter)
        else:
            model, info = _load_hf_dir("--merged", args.merged)
            problems = {k: info.get(k) or [] for k in ("missing_keys", "mismatched_keys")}
    except BadInput as e:
        print(f"hf_parity: check-peft: {e}", file=sys.stderr)
        return _finish(2, error=str(e), max_abs_diff=None, ok=False)
    _warn_kernels(args.expected, metadata)
    return _compare_logits(model, input_ids, expected, args.tolerance, problems)


def _read_tokens(prefix: str, count: int) -> torch.Tensor:
    """The first `count` tokens of the dataset at `prefix`, end to end (megatron_indexed.py)."""
    try:
        return torch.from_numpy(megatron_indexed.read_tokens(prefix, count))
    except ValueError as e:
        raise BadInput(f"--data_prefix={prefix}: {e}")


def _read_keel_eval(path: str):
    """tools:eval's per-window losses and its summary."""
    if not os.path.isfile(path):
        raise BadInput(f"--keel={path}: no such file")
    windows, summary = {}, None
    with open(path) as f:
        for number, line in enumerate(f, 1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise BadInput(f"--keel={path}:{number}: not JSON ({e})")
            if "window" in record:
                windows[record["window"]] = record["loss"]
            elif "mean_loss" in record:
                summary = record
    if summary is None or sorted(windows) != list(range(len(windows))) or not windows:
        raise BadInput(f"--keel={path}: not tools:eval's output (windows 0..N-1, then a summary)")
    return [windows[i] for i in range(len(windows))], summary


def cmd_check_eval(args) -> int:
    torch.set_num_threads(args.threads)
    try:
        keel_losses, summary = _read_keel_eval(args.keel)
        length, samples = args.sequence_length, len(keel_losses)
        if length < 1:
            raise BadInput(f"--sequence_length={length} must be >= 1")
        tokens = _read_tokens(args.data_prefix, samples * length + 1)
        if args.adapter is not None:
            model, problems = _load_peft(args.dir, args.adapter)
            if any(problems.values()):
                raise BadInput(f"--adapter={args.adapter}: peft did not take it as it is: {problems}")
            model.eval()
        else:
            try:
                model = _load(args.dir)
            except Exception as e:
                raise BadInput(f"--dir={args.dir}: transformers cannot load it: {type(e).__name__}: {e}")
    except BadInput as e:
        print(f"hf_parity: check-eval: {e}", file=sys.stderr)
        return _finish(2, error=str(e), max_abs_diff=None, ok=False)
    inputs = tokens[:-1].view(samples, length)
    labels = tokens[1:].view(samples, length)
    with torch.no_grad():
        logits = model(input_ids=inputs).logits.float()
    losses = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                               reduction="none").view(samples, length).double().mean(1)
    diffs = (losses - torch.tensor(keel_losses, dtype=torch.float64)).abs()
    mean_diff = abs(losses.mean().item() - summary["mean_loss"])
    diff = max(diffs.max().item(), mean_diff)
    ok = math.isfinite(diff) and diff <= args.tolerance
    return _finish(0 if ok else 1, max_abs_diff=diff if math.isfinite(diff) else None, ok=ok,
                  windows=samples, mean_loss=losses.mean().item())


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    sub = parser.add_subparsers(dest="command", required=True)
    record = sub.add_parser("record", parents=[common],
                            help="write the fixtures (config.json, model.safetensors, expected.safetensors)")
    record.add_argument("--out", required=True, help="directory that receives one folder per case")
    record.add_argument("--case", action="append",
                        help="record only this case (repeatable): " +
                        ", ".join(c.name for c in CASES + ADAPTER_CASES + SFT_CASES))
    check = sub.add_parser("check-export", parents=[common],
                           help="compare an exported directory's logits with a fixture's")
    check.add_argument("--dir", required=True,
                       help="directory in the Hugging Face layout (config.json, *.safetensors)")
    check.add_argument("--expected", required=True, help="a fixture's expected.safetensors")
    check.add_argument("--tolerance", type=float, default=1e-5, help="max |logit diff| allowed (default 1e-5)")
    check_peft = sub.add_parser("check-peft", parents=[common],
                                help="compare a peft adapter's (or a merged model's) logits with expected ones")
    check_peft.add_argument("--base", help="the adapted model's directory in the Hugging Face layout")
    check_peft.add_argument("--adapter", help="a peft adapter directory (adapter_config.json, "
                                              "adapter_model.safetensors), loaded over --base")
    check_peft.add_argument("--merged", help="instead of --base and --adapter: a merged model's directory")
    check_peft.add_argument("--expected", required=True,
                            help="a safetensors file with input_ids and the logits expected")
    check_peft.add_argument("--tolerance", type=float, default=1e-5,
                            help="max |logit diff| allowed (default 1e-5)")
    check_eval = sub.add_parser("check-eval", parents=[common],
                                help="compare tools:eval's losses with transformers' on the same windows")
    check_eval.add_argument("--dir", required=True, help="directory in the Hugging Face layout")
    check_eval.add_argument("--adapter", help="a peft adapter directory over --dir, loaded with "
                            "PeftModel.from_pretrained (tools:eval's --adapter)")
    check_eval.add_argument("--data_prefix", required=True, help="the indexed dataset tools:eval read")
    check_eval.add_argument("--sequence_length", type=int, required=True, help="tools:eval's L")
    check_eval.add_argument("--keel", required=True, help="tools:eval's output (JSON lines)")
    check_eval.add_argument("--tolerance", type=float, default=1e-5,
                            help="max |loss diff| per window and of the mean (default 1e-5)")
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error(f"--threads={args.threads} must be >= 1")
    transformers.utils.logging.disable_progress_bar()
    commands = {"record": cmd_record, "check-export": cmd_check_export, "check-peft": cmd_check_peft,
                "check-eval": cmd_check_eval}
    return commands[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
