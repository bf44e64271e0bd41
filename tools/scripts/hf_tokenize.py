#!/usr/bin/env python3
"""Tokenizes text with a Hugging Face model's own tokenizer into a Megatron indexed dataset
(PREFIX.bin, PREFIX.idx) that Keel's trainer reads with data.prefix, plus PREFIX.tokenizer.json,
the record tools:preprocess writes (the trainer checks that the data is in the ids of
model.pretrained_path's tokenizer and that its vocabulary covers them).

    .venv/bin/python tools/scripts/hf_tokenize.py --model=hf/Llama-3.2-1B --output_prefix=data/notes \\
        notes/*.txt
    .venv/bin/python tools/scripts/hf_tokenize.py --model=hf/Qwen3-0.6B --output_prefix=data/chat \\
        --json_keys=text --append_eod chat.jsonl     # writes data/chat_text_document

Each text FILE is one document whose non-empty lines are its sequences (as tools:preprocess
--tokenizer_model reads files); with --json_keys=K1,K2 (tools:preprocess's and Megatron's
preprocess_data.py's flag) each line of a FILE is a JSON object, and each key's text one
document of one sequence in the dataset PREFIX_<key>_document. --append_eod ends every document with the
tokenizer's EOS id. No special tokens are added otherwise (no BOS). Tokens are uint16 when the
vocabulary has fewer than 65500 ids, else int32, as Megatron's and Keel's writers choose. The
index is Megatron's MMIDIDX version 1 (megatron/core/datasets/indexed_dataset.py), written last,
so a dataset without its .idx is unfinished.

Exit status: 0 written; 1 a file cannot be read or holds no text; 2 bad usage.
Needs transformers (tools/bootstrap.sh puts it in .venv); reads the tokenizer offline.
"""

import argparse
import json
import os
import sys
from typing import List

def _documents(paths: List[str], key):
    """Each document as its list of sequences (strings): a text file's lines, or with `key` the
    text under it in each line of a JSONL file."""
    for path in paths:
        with open(path, encoding="utf-8") as f:
            if key is None:
                lines = [line.rstrip("\n") for line in f if line.strip()]
                if lines:
                    yield lines
                continue
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{number}: not JSON ({e})")
                if not isinstance(record, dict) or not isinstance(record.get(key), str):
                    raise ValueError(f"{path}:{number}: no string field '{key}'")
                if record[key]:
                    yield [record[key]]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a Hugging Face directory with the tokenizer's files")
    parser.add_argument("--output_prefix", required=True, help="writes PREFIX.bin, .idx, .tokenizer.json")
    parser.add_argument("--json_keys", default="",
                        help="FILEs are JSONL: each key's text a dataset PREFIX_<key>_document")
    parser.add_argument("--append_eod", action="store_true", help="end each document with the EOS id")
    parser.add_argument("files", nargs="+", metavar="FILE")
    args = parser.parse_args(argv)
    try:
        import hf_tokenizer
        import megatron_indexed

        tokenizer = hf_tokenizer.load(args.model)
    except (ImportError, hf_tokenizer.UsageError) as e:
        print(f"hf_tokenize: {e}", file=sys.stderr)
        return 2
    eos = tokenizer.eos_token_id
    if args.append_eod and eos is None:
        print(f"hf_tokenize: --append_eod: the tokenizer of {args.model} has no EOS token", file=sys.stderr)
        return 2
    vocab_size = len(tokenizer)
    keys = [key for key in args.json_keys.split(",") if key]
    if args.json_keys and len(keys) != len(args.json_keys.split(",")):
        print(f"hf_tokenize: --json_keys={args.json_keys} holds an empty key", file=sys.stderr)
        return 2

    def encoded(key):
        for document in _documents(args.files, key):
            ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in document]
            if args.append_eod:
                ids[-1] = ids[-1] + [eos]
            yield ids

    record = hf_tokenizer.record(args.model, tokenizer, args.append_eod)
    outputs = [(key, f"{args.output_prefix}_{key}_document") for key in keys] or [(None, args.output_prefix)]
    for key, prefix in outputs:
        try:
            counts = megatron_indexed.write(prefix, encoded(key), megatron_indexed.token_dtype(vocab_size),
                                            record)
        except (OSError, ValueError, UnicodeDecodeError) as e:
            print(f"hf_tokenize: {e}", file=sys.stderr)
            return 1
        print(f"wrote {prefix}.bin and .idx: {counts['documents']} documents, "
              f"{counts['sequences']} sequences, {counts['tokens']} tokens ({counts['dtype']}, vocabulary "
              f"{vocab_size}{'' if eos is None else f', EOS {eos}'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
