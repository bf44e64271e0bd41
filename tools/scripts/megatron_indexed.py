"""Megatron's indexed datasets (PREFIX.bin and PREFIX.idx, the MMIDIDX index of version 1, as
megatron/core/datasets/indexed_dataset.py writes and reads them), for the Python scripts here:
hf_tokenize.py and hf_sft_tokenize.py write them, hf_parity.py check-eval reads their tokens. Keel's C++ side is
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


class Writer:
    """Megatron's IndexedDatasetBuilder, streaming: add_document() appends a document's sequences to
    PREFIX.bin.tmp as they come; finish() writes `record` (unless None) as PREFIX.tokenizer.json,
    then PREFIX.idx (tools:preprocess's order: the index last, so a dataset without it is
    unfinished) and returns the counts. Files are renamed into place only by finish()."""

    def __init__(self, prefix: str, dtype):
        self.prefix, self.dtype = prefix, np.dtype(dtype)
        self.sizes, self.document_index = [], [0]
        os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
        self._bin = open(prefix + ".bin.tmp", "wb")

    def add_document(self, sequences) -> None:
        """Appends one document: each sequence a list of ids (or values of the dtype)."""
        for sequence in sequences:
            self._bin.write(np.asarray(sequence, dtype=self.dtype).tobytes(order="C"))
            self.sizes.append(len(sequence))
        self.document_index.append(len(self.sizes))

    def abandon(self) -> None:
        """Closes and removes the .bin of an unfinished writer; does nothing after finish()."""
        if self._bin.closed:
            return
        self._bin.close()
        os.remove(self.prefix + ".bin.tmp")

    def finish(self, record) -> dict:
        prefix, sizes = self.prefix, self.sizes
        if not sizes:
            self.abandon()
            raise ValueError(f"{prefix}: no sequence to write")
        self._bin.close()
        pointers = np.zeros(len(sizes), dtype=np.int64)
        pointers[1:] = np.cumsum(np.asarray(sizes[:-1], dtype=np.int64) * self.dtype.itemsize)
        with open(prefix + ".idx.tmp", "wb") as idx:
            idx.write(_MAGIC)
            idx.write(struct.pack("<QBQQ", 1, _CODES[self.dtype], len(sizes), len(self.document_index)))
            idx.write(np.asarray(sizes, dtype=np.int32).tobytes())
            idx.write(pointers.tobytes())
            idx.write(np.asarray(self.document_index, dtype=np.int64).tobytes())
        os.replace(prefix + ".bin.tmp", prefix + ".bin")
        if record is not None:
            with open(prefix + ".tokenizer.json.tmp", "w") as f:
                json.dump(record, f, indent=1)
                f.write("\n")
            os.replace(prefix + ".tokenizer.json.tmp", prefix + ".tokenizer.json")
        os.replace(prefix + ".idx.tmp", prefix + ".idx")
        return {"documents": len(self.document_index) - 1, "sequences": len(sizes), "tokens": int(sum(sizes)),
                "dtype": self.dtype.name}


def write(prefix: str, documents, dtype, record: dict) -> dict:
    """Writes each document (a list of sequences, each a list of ids) with a Writer, then
    finishes it with `record`. Returns the counts."""
    writer = Writer(prefix, dtype)
    try:
        for document in documents:
            writer.add_document(document)
    except BaseException:
        writer.abandon()
        raise
    return writer.finish(record)


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
