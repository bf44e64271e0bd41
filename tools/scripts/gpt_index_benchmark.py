#!/usr/bin/env python3
"""Keel's GPT index build beside Megatron-LM's own builder, on the same data, in one run.

Writes two indexed datasets with Megatron's IndexedDatasetBuilder, then builds the train,
valid and test datasets of the blend "0.3 A 0.7 B" (split 969,30,1, seed 1234) twice: with
Megatron-Core's BlendedMegatronDatasetBuilder (Python, numpy and its C++ helpers compiled here
with g++ and pybind11) and with Keel's sampling:gpt_dataset_benchmark, each into its own
cache directory. Reports each one's build time, wall time and peak memory (peak RSS, and the
peak of anonymous memory: what Keel's memory-mapped caches do not take), then checks that
the two caches are byte for byte the same files, that Keel loads Megatron's cache without
writing anything and Megatron loads Keel's (no rebuild), and that both serve the same first
samples of every split.

  .venv/bin/python tools/scripts/gpt_index_benchmark.py --megatron=/path/to/Megatron-LM \
      --samples=100000000                    # from the repository root

Needs tools/bootstrap.sh's .venv (torch, numpy, pybind11), Debian's python3-dev and g++, and a
Megatron-LM checkout (nothing of it is copied into Keel).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time

STUBS = {
    # The datasets need only these of megatron.core; its package __init__ imports the world.
    "megatron/__init__.py": "",
    "megatron/core/__init__.py": "",
    "megatron/core/utils.py": (
        "def log_single_rank(logger, *args, rank=0, **kwargs):\n"
        "    logger.log(*args, **kwargs)\n"),
    "megatron/core/safe_globals.py": (
        "import numpy\n"
        "def safe_numpy_load(*args, **kwargs):\n"
        "    return numpy.load(*args, **kwargs)\n"),
}

# Runs inside the prepared Megatron package: builds the datasets and prints JSON lines as
# gpt_dataset_benchmark does.
MEGATRON_DRIVER = r"""
import json, sys, time
from collections import OrderedDict
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
from megatron.core.datasets.blended_dataset import BlendedDataset
from megatron.core.datasets.utils import get_blend_from_list
args = json.loads(sys.argv[1])

class Tokenizer:
    vocab_size = args["vocab_size"]
    eod = args["vocab_size"] - 1
    unique_identifiers = OrderedDict([("class", args["tokenizer_class"])])
    def __getattr__(self, name):
        raise AttributeError(name)

config = GPTDatasetConfig(
    random_seed=args["seed"], sequence_length=args["sequence_length"],
    blend=get_blend_from_list(args["data_path"].split()), split=args["split"],
    path_to_cache=args["cache_dir"], tokenizer=Tokenizer(), reset_position_ids=False,
    reset_attention_mask=False, eod_mask_loss=False)
start = time.time()
splits = BlendedMegatronDatasetBuilder(GPTDataset, args["sizes"], lambda: True, config).build()
print(json.dumps({"build_seconds": time.time() - start}), flush=True)
for name, dataset in zip(["train", "valid", "test"], splits):
    if dataset is None:
        continue
    print(json.dumps({"split": name, "len": len(dataset)}))
    for i in range(min(args["samples"], len(dataset))):
        if isinstance(dataset, BlendedDataset):
            d, j = int(dataset.dataset_index[i]), int(dataset.dataset_sample_index[i])
            text = dataset.datasets[d]._query_document_sample_shuffle_indices(j)[0]
        else:
            d, j = 0, i
            text = dataset._query_document_sample_shuffle_indices(i)[0]
        print(json.dumps({"split": name, "index": i, "dataset": d, "dataset_sample": j,
                          "tokens": [int(t) for t in text]}))
"""

DATA_WRITER = r"""
import json, sys
import numpy, torch
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
args = json.loads(sys.argv[1])
rng = numpy.random.RandomState(args["seed"])
lengths = rng.randint(1, 2 * args["mean_length"], size=args["documents"])
builder = IndexedDatasetBuilder(args["prefix"] + ".bin", dtype=numpy.uint16)
start = 0
for length in lengths:
    tokens = (numpy.arange(start, start + length) * 7 + args["seed"]) % (args["vocab_size"] - 1)
    tokens[-1] = args["vocab_size"] - 1
    builder.add_document(torch.from_numpy(tokens.astype(numpy.int64)), [int(length)])
    start += length
builder.finalize(args["prefix"] + ".idx")
print(int(lengths.sum()))
"""


def log(message):
    print(f"gpt_index_benchmark: {message}", file=sys.stderr, flush=True)


def prepare_megatron(checkout, work):
    """A minimal megatron.core package with the datasets and their compiled helpers."""
    root = os.path.join(work, "megatron-lm")
    core = os.path.join(checkout, "megatron", "core")
    for part in ["datasets", "tokenizers"]:
        shutil.copytree(os.path.join(core, part), os.path.join(root, "megatron", "core", part))
    shutil.copy(os.path.join(core, "msc_utils.py"), os.path.join(root, "megatron", "core"))
    for path, text in STUBS.items():
        with open(os.path.join(root, path), "w") as f:
            f.write(text)
    datasets = os.path.join(root, "megatron", "core", "datasets")
    includes = subprocess.check_output([sys.executable, "-m", "pybind11", "--includes"],
                                       text=True).split()
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    # Megatron's own build line (megatron/core/datasets/Makefile).
    subprocess.check_call(["g++", "-O3", "-Wall", "-shared", "-std=c++17", "-fPIC", *includes,
                           "helpers.cpp", "-o", "helpers_cpp" + suffix], cwd=datasets)
    return root


class Measured:
    """A child process, its wall time and peak memory (ru_maxrss; anonymous memory polled)."""

    def __init__(self, argv, env=None):
        self.peak_anon_kb = 0
        start = time.time()
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, env=env, text=True)
        poller = threading.Thread(target=self._poll, daemon=True)
        poller.start()
        self.stdout = self.process.stdout.read()
        _, status, usage = os.wait4(self.process.pid, 0)
        self.process.returncode = os.waitstatus_to_exitcode(status)
        self.wall = time.time() - start
        self.peak_rss_kb = usage.ru_maxrss
        poller.join()
        if self.process.returncode != 0:
            raise SystemExit(f"{argv[0]} failed ({self.process.returncode})")
        self.lines = [json.loads(line) for line in self.stdout.splitlines()]
        self.build_seconds = self.lines[0]["build_seconds"]

    def _poll(self):
        path = f"/proc/{self.process.pid}/status"
        while True:
            try:
                with open(path) as f:
                    for line in f:
                        if line.startswith("RssAnon:"):
                            self.peak_anon_kb = max(self.peak_anon_kb, int(line.split()[1]))
            except (FileNotFoundError, ProcessLookupError):
                return
            if self.process.poll() is not None:
                return
            time.sleep(0.02)


def listing(directory):
    return {name: os.stat(os.path.join(directory, name)).st_mtime_ns
            for name in sorted(os.listdir(directory))}


def same_files(a, b):
    names = sorted(os.listdir(a))
    if names != sorted(os.listdir(b)):
        return False
    for name in names:
        with open(os.path.join(a, name), "rb") as fa, open(os.path.join(b, name), "rb") as fb:
            while True:
                x, y = fa.read(1 << 24), fb.read(1 << 24)
                if x != y:
                    log(f"{name} differs")
                    return False
                if not x:
                    break
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--megatron", required=True, help="a Megatron-LM checkout")
    parser.add_argument("--samples", type=int, default=100_000_000, help="train split size")
    parser.add_argument("--valid_samples", type=int, default=100_000)
    parser.add_argument("--sequence_length", type=int, default=64)
    parser.add_argument("--documents", type=int, default=100_000, help="per dataset")
    parser.add_argument("--mean_length", type=int, default=500, help="tokens per document")
    parser.add_argument("--check_samples", type=int, default=64, help="compared per split")
    parser.add_argument("--work", default=None, help="default: a new temporary directory")
    args = parser.parse_args()
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    work = args.work or tempfile.mkdtemp(prefix="keel-gpt-index-benchmark.")
    log(f"work directory {work}")
    subprocess.check_call(["bazel", "build", "--config=opt", "//sampling:gpt_dataset_benchmark"],
                          cwd=repo, stdout=sys.stderr)
    bin_dir = subprocess.check_output(["bazel", "info", "--config=opt", "bazel-bin"], cwd=repo,
                                      text=True).strip()
    keel = os.path.join(bin_dir, "sampling", "gpt_dataset_benchmark")
    megatron = prepare_megatron(args.megatron, work)
    env = dict(os.environ, PYTHONPATH=megatron)
    vocab_size = 32000
    tokens = 0
    for name, seed in [("a", 1), ("b", 2)]:
        spec = {"prefix": os.path.join(work, name), "seed": seed, "vocab_size": vocab_size,
                "documents": args.documents, "mean_length": args.mean_length}
        tokens += int(subprocess.check_output([sys.executable, "-c", DATA_WRITER, json.dumps(spec)],
                                              env=env, text=True))
    log(f"2 datasets, {2 * args.documents} documents, {tokens} tokens")
    common = {"data_path": f"0.3 {work}/a 0.7 {work}/b", "split": "969,30,1", "seed": 1234,
              "sequence_length": args.sequence_length, "tokenizer_class": "KeelBenchmarkTokenizer"}
    sizes = [args.samples, args.valid_samples, 0]

    def run_megatron(cache_dir):
        spec = dict(common, sizes=sizes, cache_dir=cache_dir, vocab_size=vocab_size,
                    samples=args.check_samples)
        return Measured([sys.executable, "-c", MEGATRON_DRIVER, json.dumps(spec)], env=env)

    def run_keel(cache_dir, load_only=False):
        return Measured([keel, f"--data_path={common['data_path']}", f"--split={common['split']}",
                         f"--seed={common['seed']}",
                         f"--sequence_length={common['sequence_length']}",
                         f"--sizes={','.join(map(str, sizes))}", f"--cache_dir={cache_dir}",
                         f"--tokenizer_class={common['tokenizer_class']}",
                         f"--samples={args.check_samples}", f"--load_only={load_only}"])

    megatron_cache, keel_cache = os.path.join(work, "cache-megatron"), os.path.join(work, "cache-keel")
    m = run_megatron(megatron_cache)
    k = run_keel(keel_cache)
    identical = same_files(megatron_cache, keel_cache)
    before = listing(megatron_cache)
    k_on_m = run_keel(megatron_cache, load_only=True)
    keel_wrote_nothing = listing(megatron_cache) == before
    before = listing(keel_cache)
    m_on_k = run_megatron(keel_cache)
    megatron_rebuilt_nothing = listing(keel_cache) == before
    same_samples = m.lines[1:] == k.lines[1:] == k_on_m.lines[1:] == m_on_k.lines[1:]
    print(f"{tokens} tokens in 2 datasets; train {args.samples}, valid {args.valid_samples} "
          f"samples of {args.sequence_length} tokens; blend 0.3/0.7, split 969,30,1\n")
    print("| builder | build s | wall s | peak RSS MiB | peak anonymous MiB |")
    print("|---|---|---|---|---|")
    for name, r in [("Megatron-LM (Python + C++ helpers)", m), ("Keel", k),
                    ("Keel loading Megatron's cache", k_on_m),
                    ("Megatron loading Keel's cache", m_on_k)]:
        print(f"| {name} | {r.build_seconds:.2f} | {r.wall:.2f} | {r.peak_rss_kb / 1024:.0f} | "
              f"{r.peak_anon_kb / 1024:.0f} |")
    print(f"\ncache files byte for byte identical: {identical}; Keel loaded Megatron's without "
          f"writing: {keel_wrote_nothing}; Megatron loaded Keel's without rebuilding: "
          f"{megatron_rebuilt_nothing}; first {args.check_samples} samples of every split equal: "
          f"{same_samples}")
    if not (identical and keel_wrote_nothing and megatron_rebuilt_nothing and same_samples):
        sys.exit(1)
    if args.work is None:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
