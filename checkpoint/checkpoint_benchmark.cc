// Save and load of a model-like training state (parameters plus AdamW's exp_avg and
// exp_avg_sq, in 64 MiB float tensors) against the floors in the same run: write()+fsync and
// read() of the same bytes in one file, a memcpy of the state (the stall floor of an async
// save), and LibTorch's own torch::save / torch::load.
//
//   bazel run -c opt //checkpoint:checkpoint_benchmark -- --benchmark_out_format=console
//
// The argument is the state size in GiB. Files go to $KEEL_BENCHMARK_DIR (default /tmp);
// reads come from the page cache for every contender alike, except in the /cold cases, which
// drop the files' pages (posix_fadvise DONTNEED, outside the timed region) before each
// iteration, as after a restart. The /cuda cases hold the state on the GPU and skip without one.
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_testutil.h"
#include "torch/cuda.h"
#include "torch/serialize.h"

namespace keel::checkpoint {
namespace {

using ::keel::checkpoint::testing::TensorsState;

constexpr int64_t kTensorFloats = int64_t{16} << 20;  // 64 MiB

std::string BenchmarkDir() {
  const char* dir = std::getenv("KEEL_BENCHMARK_DIR");
  return dir != nullptr ? dir : "/tmp";
}

// Parameters with AdamW state, ~`gib` GiB in all: three 64 MiB tensors per parameter.
TensorsState ModelLikeState(int64_t gib) {
  const int64_t parameters = std::max<int64_t>(1, (gib << 30) / (3 * kTensorFloats * 4));
  TensorsState state;
  for (int64_t i = 0; i < parameters; ++i) {
    state.tensors[absl::StrCat("param", i)] = {at::randn({kTensorFloats})};
    state.tensors[absl::StrCat("param", i, ".exp_avg")] = {at::randn({kTensorFloats})};
    state.tensors[absl::StrCat("param", i, ".exp_avg_sq")] = {at::rand({kTensorFloats})};
  }
  state.values = {{"step", 1000}};
  return state;
}

// False (and the benchmark skipped) for a CUDA case on a machine without a GPU.
bool HasDevice(benchmark::State& state, at::DeviceType device) {
  if (device == at::kCUDA && !torch::cuda::is_available()) {
    state.SkipWithError("no CUDA device");
    return false;
  }
  return true;
}

// ModelLikeState on `device`.
TensorsState ModelLikeStateOn(int64_t gib, at::DeviceType device) {
  TensorsState state = ModelLikeState(gib);
  for (auto& [key, ref] : state.tensors) ref.tensor = ref.tensor.to(device);
  return state;
}

int64_t Bytes(const TensorsState& state) {
  int64_t bytes = 0;
  for (const auto& [key, ref] : state.tensors) bytes += ref.tensor.nbytes();
  return bytes;
}

void Check(const absl::Status& status, benchmark::State& state) {
  if (!status.ok()) state.SkipWithError(std::string(status.message()).c_str());
}

void RemoveAll(const std::string& path) {
  const std::string command = absl::StrCat("rm -rf '", path, "'");
  if (std::system(command.c_str()) != 0) std::abort();
}

// Drops the page-cache pages of every file under `path` (a file or a directory): the next
// read comes from the disk. The files must be clean (written back), as after an fsync.
void DropCache(const std::string& path) {
  std::vector<std::string> files = {path};
  if (std::filesystem::is_directory(path)) {
    files.clear();
    for (const auto& entry : std::filesystem::recursive_directory_iterator(path)) {
      if (entry.is_regular_file()) files.push_back(entry.path());
    }
  }
  for (const std::string& file : files) {
    const int fd = ::open(file.c_str(), O_RDONLY);
    if (fd < 0 || ::fdatasync(fd) != 0 || ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) != 0) {
      std::abort();
    }
    ::close(fd);
  }
}

void WriteRaw(const TensorsState& tensors, const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  for (const auto& [key, ref] : tensors.tensors) {
    const char* data = static_cast<const char*>(ref.tensor.data_ptr());
    for (size_t done = 0, size = ref.tensor.nbytes(); done < size;) {
      done += static_cast<size_t>(::write(fd, data + done, size - done));
    }
  }
  ::fsync(fd);
  ::close(fd);
}

void BM_RawWriteFsync(benchmark::State& state) {
  const TensorsState tensors = ModelLikeState(state.range(0));
  const std::string path = BenchmarkDir() + "/keel_bench_raw";
  for (auto _ : state) WriteRaw(tensors, path);
  RemoveAll(path);
  state.SetBytesProcessed(state.iterations() * Bytes(tensors));
}

void BM_KeelSave(benchmark::State& state, at::DeviceType device) {
  if (!HasDevice(state, device)) return;
  TensorsState tensors = ModelLikeStateOn(state.range(0), device);
  const std::string dir = BenchmarkDir() + "/keel_bench_save";
  RemoveAll(dir);
  CheckpointerOptions options;
  options.checkpoint_dir = dir;
  options.keep_last_k = 1;
  auto checkpointer = Checkpointer::Create(options, nullptr);
  int64_t step = 0;
  for (auto _ : state) Check((*checkpointer)->Save({{"model", &tensors}}, ++step, 0), state);
  RemoveAll(dir);
  state.SetBytesProcessed(state.iterations() * Bytes(tensors));
}

void BM_TorchSave(benchmark::State& state) {
  const TensorsState tensors = ModelLikeState(state.range(0));
  std::vector<at::Tensor> list;
  for (const auto& [key, ref] : tensors.tensors) list.push_back(ref.tensor);
  const std::string path = BenchmarkDir() + "/keel_bench_torch.pt";
  for (auto _ : state) torch::save(list, path);
  RemoveAll(path);
  state.SetBytesProcessed(state.iterations() * Bytes(tensors));
}

void BM_RawRead(benchmark::State& state, bool cold) {
  TensorsState tensors = ModelLikeState(state.range(0));
  const std::string path = BenchmarkDir() + "/keel_bench_raw_read";
  WriteRaw(tensors, path);
  for (auto _ : state) {
    if (cold) {
      state.PauseTiming();
      DropCache(path);
      state.ResumeTiming();
    }
    const int fd = ::open(path.c_str(), O_RDONLY);
    for (auto& [key, ref] : tensors.tensors) {
      char* data = static_cast<char*>(ref.tensor.data_ptr());
      for (size_t done = 0, size = ref.tensor.nbytes(); done < size;) {
        done += static_cast<size_t>(::read(fd, data + done, size - done));
      }
    }
    ::close(fd);
  }
  RemoveAll(path);
  state.SetBytesProcessed(state.iterations() * Bytes(tensors));
}

void BM_KeelLoad(benchmark::State& state, at::DeviceType device, bool cold) {
  if (!HasDevice(state, device)) return;
  TensorsState tensors = ModelLikeStateOn(state.range(0), device);
  const std::string dir = BenchmarkDir() + "/keel_bench_load";
  RemoveAll(dir);
  CheckpointerOptions options;
  options.checkpoint_dir = dir;
  Check((*Checkpointer::Create(options, nullptr))->Save({{"model", &tensors}}, 1, 0), state);
  // Saves write around the page cache (O_DIRECT); one verifying read puts the files there, as
  // the raw read's buffered write does for its file, so both loads read from memory.
  const absl::StatusOr<VerifyReport> verified =
      Verify(dir + "/step_0000000001", VerifyLevel::kChecksums);
  Check(verified.ok() ? verified->ToStatus() : verified.status(), state);
  TensorsState target = tensors.EmptyLike(0);
  for (auto _ : state) {
    if (cold) {
      state.PauseTiming();
      DropCache(dir);
      state.ResumeTiming();
    }
    Check(LoadCheckpoint(dir + "/step_0000000001", {{"model", &target}}).status(), state);
    if (device == at::kCUDA) torch::cuda::synchronize();
  }
  RemoveAll(dir);
  state.SetBytesProcessed(state.iterations() * Bytes(tensors));
}

void BM_TorchLoad(benchmark::State& state) {
  const TensorsState tensors = ModelLikeState(state.range(0));
  std::vector<at::Tensor> list;
  for (const auto& [key, ref] : tensors.tensors) list.push_back(ref.tensor);
  const std::string path = BenchmarkDir() + "/keel_bench_torch_load.pt";
  torch::save(list, path);
  for (auto _ : state) {
    std::vector<at::Tensor> loaded;
    torch::load(loaded, path);
    benchmark::DoNotOptimize(loaded);
  }
  RemoveAll(path);
  state.SetBytesProcessed(state.iterations() * Bytes(tensors));
}

// The floor for an async save's stall: copying the state into memory already mapped.
void BM_Memcpy(benchmark::State& state) {
  const TensorsState tensors = ModelLikeState(state.range(0));
  TensorsState copy = tensors.EmptyLike(0);
  for (auto _ : state) {
    for (const auto& [key, ref] : tensors.tensors) {
      std::memcpy(copy.tensors.at(key).tensor.data_ptr(), ref.tensor.data_ptr(),
                  ref.tensor.nbytes());
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * Bytes(tensors));
}

// The floor for the stall of a GPU state's async save: copying it into pinned host memory.
void BM_DeviceToHost(benchmark::State& state) {
  if (!HasDevice(state, at::kCUDA)) return;
  const TensorsState tensors = ModelLikeStateOn(state.range(0), at::kCUDA);
  std::vector<at::Tensor> host;
  for (const auto& [key, ref] : tensors.tensors) {
    host.push_back(
        at::empty(ref.tensor.sizes(), ref.tensor.options().device(at::kCPU).pinned_memory(true)));
  }
  for (auto _ : state) {
    size_t i = 0;
    for (const auto& [key, ref] : tensors.tensors)
      host[i++].copy_(ref.tensor, /*non_blocking=*/true);
    torch::cuda::synchronize();
  }
  state.SetBytesProcessed(state.iterations() * Bytes(tensors));
}

// The training-side stall of an async save: Save() returns after the snapshot; the write
// finishes outside the timed region.
void BM_KeelAsyncSaveStall(benchmark::State& state, at::DeviceType device) {
  if (!HasDevice(state, device)) return;
  TensorsState tensors = ModelLikeStateOn(state.range(0), device);
  const std::string dir = BenchmarkDir() + "/keel_bench_async";
  RemoveAll(dir);
  CheckpointerOptions options;
  options.checkpoint_dir = dir;
  options.keep_last_k = 1;
  options.is_async = true;
  auto checkpointer = Checkpointer::Create(options, nullptr);
  int64_t step = 0;
  // One save first, so the staging buffers exist as they do in a training run.
  Check((*checkpointer)->Save({{"model", &tensors}}, ++step, 0), state);
  for (auto _ : state) {
    state.PauseTiming();
    Check((*checkpointer)->Wait(), state);
    state.ResumeTiming();
    Check((*checkpointer)->Save({{"model", &tensors}}, ++step, 0), state);
  }
  Check((*checkpointer)->Wait(), state);
  RemoveAll(dir);
  state.SetBytesProcessed(state.iterations() * Bytes(tensors));
}

void Sizes(benchmark::internal::Benchmark* benchmark) {
  benchmark->Arg(1)->Arg(4)->Iterations(3)->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK(BM_RawWriteFsync)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_KeelSave, cpu, at::kCPU)->Apply(Sizes);
BENCHMARK(BM_TorchSave)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_RawRead, warm, false)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_KeelLoad, cpu, at::kCPU, false)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_RawRead, cold, true)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_KeelLoad, cpu_cold, at::kCPU, true)->Apply(Sizes);
BENCHMARK(BM_TorchLoad)->Apply(Sizes);
BENCHMARK(BM_Memcpy)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_KeelAsyncSaveStall, cpu, at::kCPU)->Apply(Sizes);
// The state on the GPU (skipped without one): saves and loads through host buffers, and the
// async stall beside a device-to-host copy into pinned memory.
BENCHMARK_CAPTURE(BM_KeelSave, cuda, at::kCUDA)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_KeelLoad, cuda, at::kCUDA, false)->Apply(Sizes);
BENCHMARK(BM_DeviceToHost)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_KeelAsyncSaveStall, cuda, at::kCUDA)->Apply(Sizes);

}  // namespace
}  // namespace keel::checkpoint
