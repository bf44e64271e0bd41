"""Megatron's indexed datasets (PREFIX.bin and PREFIX.idx, the MMIDIDX index of version 1, as
megatron/core/datasets/indexed_dataset.py writes and reads them), for the Python scripts here:
hf_tokenize.py writes them, hf_parity.py check-eval reads their tokens. Keel's C++ side is
sampling/indexed_dataset.h. Errors are ValueError naming the file."""

import json
import os
import struct

import numpy as np

_MAGIC = b"MMIDIDX\x00\x00"
# Megatron's DType codes.
_DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32,
           8: np.uint16}
_CODES = {np.dtype(dtype): code for code, dtype in _DTYPES.items()}


def token_dtype(vocab_size: int):
    """uint16 below 65500 ids, else int32, as Megatron's and Keel's writers choose."""
    return np.uint16 if vocab_size < 65500 else np.int32


def write(prefix: str, documents, dtype, record: dict) -> dict:
    """Writes each document (a list of sequences, each a list of ids) to PREFIX.bin, then `record`
    as PREFIX.tokenizer.json, then PREFIX.idx (tools:preprocess's order: the index last, so a
    dataset without it is unfinished). Returns the counts."""
    sizes, document_index = [], [0]
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    with open(prefix + ".bin.tmp", "wb") as bin_file:
        for document in documents:
            for sequence in document:
                bin_file.write(np.asarray(sequence, dtype=dtype).tobytes(order="C"))
                sizes.append(len(sequence))
            document_index.append(len(sizes))
    if not sizes:
        os.remove(prefix + ".bin.tmp")
        raise ValueError(f"{prefix}: no sequence to write")
    pointers = np.zeros(len(sizes), dtype=np.int64)
    pointers[1:] = np.cumsum(np.asarray(sizes[:-1], dtype=np.int64) * np.dtype(dtype).itemsize)
    with open(prefix + ".idx.tmp", "wb") as idx:
        idx.write(_MAGIC)
        idx.write(struct.pack("<QBQQ", 1, _CODES[np.dtype(dtype)], len(sizes), len(document_index)))
        idx.write(np.asarray(sizes, dtype=np.int32).tobytes())
        idx.write(pointers.tobytes())
        idx.write(np.asarray(document_index, dtype=np.int64).tobytes())
    os.replace(prefix + ".bin.tmp", prefix + ".bin")
    with open(prefix + ".tokenizer.json.tmp", "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    os.replace(prefix + ".tokenizer.json.tmp", prefix + ".tokenizer.json")
    os.replace(prefix + ".idx.tmp", prefix + ".idx")
    return {"documents": len(document_index) - 1, "sequences": len(sizes), "tokens": int(sum(sizes)),
            "dtype": np.dtype(dtype).name}


def read_tokens(prefix: str, count: int) -> np.ndarray:
    """The first `count` tokens of the dataset's sequences laid end to end, as int64."""
    for suffix in (".idx", ".bin"):
        if not os.path.isfile(prefix + suffix):
            raise ValueError(f"no {prefix + suffix}")
    with open(prefix + ".idx", "rb") as f:
        header = f.read(len(_MAGIC) + struct.calcsize("<QBQQ"))
        if len(header) < 34 or header[:len(_MAGIC)] != _MAGIC:
            raise ValueError(f"{prefix}.idx: not a Megatron index (magic {header[:9]!r})")
        _, code, sequences, _ = struct.unpack("<QBQQ", header[len(_MAGIC):])
        if code not in _DTYPES:
            raise ValueError(f"{prefix}.idx: unknown dtype code {code}")
        sizes = np.frombuffer(f.read(4 * sequences), dtype=np.int32)
        pointers = np.frombuffer(f.read(8 * sequences), dtype=np.int64)
    dtype = np.dtype(_DTYPES[code])
    data = np.memmap(prefix + ".bin", dtype=np.uint8, mode="r")
    pieces, have = [], 0
    for size, pointer in zip(sizes, pointers):
        if have >= count:
            break
        pieces.append(np.frombuffer(data[pointer:pointer + int(size) * dtype.itemsize], dtype=dtype))
        have += int(size)
    if have < count:
        raise ValueError(f"{prefix}: {have} tokens, {count} needed")
    return np.concatenate(pieces)[:count].astype(np.int64)
