// Random-access reads from a Megatron indexed dataset against the raw speed of its mapping.
// One 512 MiB uint16 dataset (documents of 100 to 2000 tokens) is written once to $TMPDIR (or
// /tmp) and read warm from the page cache. Bytes are the .bin bytes a read covers.
//
//   bazel run -c opt //sampling:indexed_dataset_benchmark
//
// BM_GptSample: FixedWindowDataset::Sample (a window of L + 1 tokens widened to int64, Megatron's
//   type) at random sample indices.
// BM_RawWindow: memcpy of the same byte windows out of the mapping: the baseline.
// BM_GetSequence: IndexedDataset::Get of random whole sequences: a zero-copy view of the
//   uint16 tokens.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "sampling/fixed_window_dataset.h"
#include "sampling/indexed_dataset.h"

namespace keel::sampling {
namespace {

constexpr int64_t kTokens = int64_t{256} << 20;  // 512 MiB of uint16
constexpr int kReadsPerIteration = 1024;

std::string Prefix() {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/keel_indexed_dataset_benchmark";
}

// Writes and opens the dataset. A failure aborts the benchmark run.
const IndexedDataset* Build() {
  const std::string prefix = Prefix() + "_uint16";
  auto writer = IndexedDatasetWriter::Create(prefix, TokenDtype::kUint16);
  if (!writer.ok()) std::abort();
  std::mt19937_64 random(1);
  std::vector<int64_t> tokens;
  for (int64_t written = 0; written < kTokens;) {
    tokens.resize(std::min<int64_t>(100 + random() % 1901, kTokens - written));
    for (int64_t& token : tokens) token = static_cast<int64_t>(random() % 50000);
    if (!writer->AddItem(tokens).ok()) std::abort();
    writer->EndDocument();
    written += static_cast<int64_t>(tokens.size());
  }
  if (!writer->Finalize().ok()) std::abort();
  auto opened = IndexedDataset::Open(prefix);
  if (!opened.ok()) std::abort();
  return new IndexedDataset(*std::move(opened));
}

// The dataset, built on first use.
const IndexedDataset& Dataset() {
  static const IndexedDataset* dataset = Build();
  return *dataset;
}

std::vector<int64_t> RandomIndices(int64_t size, int64_t count) {
  std::mt19937_64 random(42);
  std::vector<int64_t> indices(count);
  for (int64_t& index : indices) index = static_cast<int64_t>(random() % size);
  return indices;
}

void BM_GptSample(benchmark::State& state) {
  FixedWindowDatasetOptions options;
  options.sequence_length = state.range(0);
  auto gpt = FixedWindowDataset::Create(Dataset(), options);
  if (!gpt.ok()) return state.SkipWithError("FixedWindowDataset::Create failed");
  const std::vector<int64_t> indices = RandomIndices(gpt->size(), kReadsPerIteration);
  for (auto _ : state) {
    for (const int64_t index : indices) {
      absl::StatusOr<at::Tensor> sample = gpt->Sample(index);
      benchmark::DoNotOptimize(sample->data_ptr());
    }
  }
  state.SetItemsProcessed(state.iterations() * kReadsPerIteration);
  state.SetBytesProcessed(state.iterations() * kReadsPerIteration * (state.range(0) + 1) * 2);
}

void BM_RawWindow(benchmark::State& state) {
  const int64_t window = (state.range(0) + 1) * 2;
  const IndexedDataset& dataset = Dataset();
  const uint8_t* bin = dataset.bin_bytes().data();
  const std::vector<int64_t> indices =
      RandomIndices((dataset.num_tokens() - 1) / state.range(0), kReadsPerIteration);
  std::vector<uint8_t> buffer(window);
  for (auto _ : state) {
    for (const int64_t index : indices) {
      std::memcpy(buffer.data(), bin + index * state.range(0) * 2, window);
      benchmark::ClobberMemory();
    }
  }
  state.SetItemsProcessed(state.iterations() * kReadsPerIteration);
  state.SetBytesProcessed(state.iterations() * kReadsPerIteration * window);
}

void BM_GetSequence(benchmark::State& state) {
  const IndexedDataset& dataset = Dataset();
  const std::vector<int64_t> indices = RandomIndices(dataset.size(), kReadsPerIteration);
  int64_t bytes = 0;
  for (const int64_t index : indices) {
    bytes += dataset.sequence_length(index) * TokenDtypeSize(dataset.dtype());
  }
  for (auto _ : state) {
    for (const int64_t index : indices) {
      absl::StatusOr<at::Tensor> tokens = dataset.Get(index);
      benchmark::DoNotOptimize(tokens->data_ptr());
    }
  }
  state.SetItemsProcessed(state.iterations() * kReadsPerIteration);
  state.SetBytesProcessed(state.iterations() * bytes);
}

BENCHMARK(BM_GptSample)->Arg(1024)->Arg(4096)->MinTime(1.0);
BENCHMARK(BM_RawWindow)->Arg(1024)->Arg(4096)->MinTime(1.0);
BENCHMARK(BM_GetSequence)->MinTime(1.0);

}  // namespace
}  // namespace keel::sampling
