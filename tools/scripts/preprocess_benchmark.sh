#!/usr/bin/env bash
# Tokens per second of tools:preprocess --tokenizer_model beside SentencePiece's own encoders on
# the same text, in one run: Keel on 1 and 2 threads (plain text, and JSONL as Megatron's
# preprocess_data.py reads it), spm_encode (SentencePiece's C++ command-line encoder, one
# process), and Python's sentencepiece encoding line by line (what each preprocess_data.py
# worker does). The text is the default corpus's license texts repeated to --megabytes; the
# model is a unigram model of --vocab_size pieces that spm_train learns from one copy of them.
#
#   tools/scripts/preprocess_benchmark.sh                     # from the repository root
#   tools/scripts/preprocess_benchmark.sh --megabytes=64 --vocab_size=1000 --rounds=5
#
# Checks that every Keel dataset holds spm_encode's ids exactly, then prints a markdown table:
# seconds and tokens/s of each, best of --rounds.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
megabytes=32
vocab_size=2000
rounds=3
for arg in "$@"; do
  case "${arg}" in
    --megabytes=*) megabytes=${arg#*=} ;;
    --vocab_size=*) vocab_size=${arg#*=} ;;
    --rounds=*) rounds=${arg#*=} ;;
    *)
      sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
      exit 2
      ;;
  esac
done

work=$(mktemp -d "${TMPDIR:-/tmp}/keel-preprocess-benchmark.XXXXXX")
log() { echo "preprocess_benchmark: $*" >&2; }
log "work directory ${work}"
(cd "${repo_root}" && bazel build --config=opt //tools:preprocess >&2)
preprocess="$(cd "${repo_root}" && bazel info --config=opt bazel-bin)/tools/preprocess"

cat /usr/share/common-licenses/* >"${work}/licenses.txt"
spm_train --input="${work}/licenses.txt" --model_prefix="${work}/m" --vocab_size="${vocab_size}" \
  --minloglevel=2 --hard_vocab_limit=false >/dev/null 2>&1
# One line per non-empty line of the licenses, repeated to the size asked for.
grep -v '^[[:space:]]*$' "${work}/licenses.txt" >"${work}/lines.txt"
: >"${work}/text.txt"
while (($(stat -c %s "${work}/text.txt") < megabytes << 20)); do
  cat "${work}/lines.txt" >>"${work}/text.txt"
done
/usr/bin/python3 - "${work}/text.txt" "${work}/text.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], encoding="utf-8") as f, open(sys.argv[2], "w", encoding="utf-8") as out:
    for line in f:
        out.write(json.dumps({"text": line.rstrip("\n")}) + "\n")
PY

# best SECONDS_FILE COMMAND...: runs COMMAND --rounds times, keeps the fastest wall time.
best() {
  local file=$1
  shift
  /usr/bin/python3 - "${rounds}" "${file}" "$@" <<'PY'
import subprocess, sys, time
rounds, file, command = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
times = []
for _ in range(rounds):
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    times.append(time.perf_counter() - start)
open(file, "w").write(f"{min(times)}\n")
PY
}

tokens=$(spm_encode --model="${work}/m.model" --output_format=id <"${work}/text.txt" | wc -w)
log "${tokens} tokens in $(stat -c %s "${work}/text.txt") bytes"
best "${work}/spm.s" sh -c "spm_encode --model='${work}/m.model' --output_format=id <'${work}/text.txt' >'${work}/ids.txt'"
best "${work}/python.s" /usr/bin/python3 -c "
import sentencepiece as spm, sys
sp = spm.SentencePieceProcessor(model_file='${work}/m.model')
n = 0
for line in open('${work}/text.txt', encoding='utf-8'):
    n += len(sp.encode(line.rstrip('\n')))
print(n)"
for threads in 1 2; do
  best "${work}/keel_text_${threads}.s" "${preprocess}" --tokenizer_model="${work}/m.model" \
    --workers="${threads}" --output_prefix="${work}/text_${threads}" "${work}/text.txt"
  best "${work}/keel_jsonl_${threads}.s" "${preprocess}" --tokenizer_model="${work}/m.model" \
    --workers="${threads}" --json_keys=text --output_prefix="${work}/jsonl_${threads}" \
    "${work}/text.jsonl"
done

# Every Keel dataset holds spm_encode's ids exactly, a sequence per line (no line is blank).
/usr/bin/python3 - "${work}" <<'PY'
import struct, sys
import numpy as np
work = sys.argv[1]
ids = [np.array(line.split(), dtype=np.int64) for line in open(f"{work}/ids.txt")]
for prefix in ["text_1", "text_2", "jsonl_1_text_document", "jsonl_2_text_document"]:
    index = open(f"{work}/{prefix}.idx", "rb").read()
    count = struct.unpack("<Q", index[18:26])[0]
    dtype = {8: np.uint16, 4: np.int32}[index[17]]
    tokens = np.fromfile(f"{work}/{prefix}.bin", dtype=dtype).astype(np.int64)
    lengths = np.frombuffer(index, np.int32, count, 34)
    if not (np.array_equal(lengths, [len(i) for i in ids])
            and np.array_equal(tokens, np.concatenate(ids))):
        sys.exit(f"preprocess_benchmark: {prefix} differs from spm_encode's ids")
print(f"preprocess_benchmark: every dataset equals spm_encode's {len(ids)} lines", file=sys.stderr)
PY

row() {
  local name=$1 seconds
  seconds=$(cat "$2")
  printf '| %s | %.2f s | %s |\n' "${name}" "${seconds}" \
    "$(/usr/bin/python3 -c "print(f'{${tokens} / ${seconds}:,.0f}')")"
}
echo "## tools:preprocess --tokenizer_model: tokens per second"
echo
echo "- $(stat -c %s "${work}/text.txt") bytes of text, ${tokens} tokens, unigram model of ${vocab_size} pieces;" \
  "$(nproc) cores; best of ${rounds}; work directory ${work}"
echo
echo "| encoder | seconds | tokens/s |"
echo "|---|---:|---:|"
row "spm_encode (C++, 1 process)" "${work}/spm.s"
row "Python sentencepiece, line by line (1 process)" "${work}/python.s"
row "Keel preprocess, text, 1 thread" "${work}/keel_text_1.s"
row "Keel preprocess, text, 2 threads" "${work}/keel_text_2.s"
row "Keel preprocess, JSONL, 1 thread" "${work}/keel_jsonl_1.s"
row "Keel preprocess, JSONL, 2 threads" "${work}/keel_jsonl_2.s"
