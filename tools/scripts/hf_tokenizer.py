"""A Hugging Face model's own tokenizer for the scripts that write Keel datasets in its ids
(hf_tokenize.py, hf_sft_tokenize.py): loading it offline, and the record written beside the
dataset (PREFIX.tokenizer.json, tools/recipe/tokenizer_info.h) that the trainer and tools:eval
check against model.pretrained_path's tokenizer."""

import os


class UsageError(Exception):
    """The model directory or the environment cannot give a tokenizer (exit status 2)."""


def load(model: str):
    """The tokenizer transformers' AutoTokenizer reads from the directory `model`, offline."""
    try:
        from transformers import AutoTokenizer
    except ImportError as e:
        raise UsageError(f"{e}; run tools/bootstrap.sh and use .venv/bin/python")
    if not os.path.isdir(model):
        raise UsageError(f"--model={model}: no such directory")
    try:
        return AutoTokenizer.from_pretrained(model, local_files_only=True)
    except Exception as e:  # transformers raises OSError or ValueError for a directory without one
        raise UsageError(f"--model={model}: no tokenizer transformers can load ({type(e).__name__}: {e})")


def record(model: str, tokenizer, append_eod: bool) -> dict:
    """PREFIX.tokenizer.json's fields for ids from `tokenizer` (read from `model`)."""
    eos = tokenizer.eos_token_id
    return {"tokenizer_model": os.path.abspath(model), "vocab_size": len(tokenizer),
            "eos_id": -1 if eos is None else eos, "append_eod": append_eod, "tokenizer_type": "huggingface"}
