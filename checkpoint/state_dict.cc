#include "checkpoint/state_dict.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "ATen/ATen.h"
#include "ATen/core/grad_mode.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/enum.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "checkpoint/internal/saved_state.h"

namespace keel::checkpoint {
namespace {

constexpr base::EnumSpelling<SerializationFormat> kSerializationFormats[] = {
    {SerializationFormat::kKeel, "keel"}, {SerializationFormat::kSafetensors, "safetensors"}};

std::string Shape(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// The block of the global tensor that `target` stands for.
absl::Status TargetBlock(const std::string& key, const TensorRef& target,
                         std::vector<int64_t>& global, std::vector<int64_t>& offsets) {
  const std::vector<int64_t> local = target.tensor.sizes().vec();
  if (!target.layout) {
    global = local;
    offsets.assign(local.size(), 0);
    return absl::OkStatus();
  }
  global = target.layout->global_shape;
  offsets = target.layout->offsets;
  if (global.size() != local.size() || offsets.size() != local.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, ": layout global_shape ", Shape(global), " and offsets ", Shape(offsets),
                     " must have the local tensor's rank (", local.size(), ")"));
  }
  for (size_t d = 0; d < local.size(); ++d) {
    if (offsets[d] < 0 || offsets[d] + local[d] > global[d]) {
      return absl::InvalidArgumentError(
          absl::StrCat(key, ": local block at offsets ", Shape(offsets), " with shape ",
                       Shape(local), " does not fit in global shape ", Shape(global)));
    }
  }
  return absl::OkStatus();
}

// Saved tensors held in memory (LoadFromMemory).
class MemorySavedState : public internal::SavedState {
 public:
  explicit MemorySavedState(const std::map<std::string, State>& saved) {
    for (const auto& [name, state] : saved) {
      values_[name] = {state.values};
      for (const auto& [key, ref] : state.tensors) {
        internal::SavedTensor& tensor = tensors_[absl::StrCat(name, "/", key)];
        internal::SavedChunk chunk;
        chunk.lengths = ref.tensor.sizes().vec();
        chunk.offsets =
            ref.layout ? ref.layout->offsets : std::vector<int64_t>(chunk.lengths.size(), 0);
        chunk.source_index = static_cast<int64_t>(sources_.size());
        tensor.info.dtype = ref.tensor.scalar_type();
        tensor.info.shape = ref.layout ? ref.layout->global_shape : chunk.lengths;
        tensor.chunks.push_back(std::move(chunk));
        sources_.push_back(ref.tensor);
      }
    }
  }

  absl::Status ReadChunk(const std::string& key, const internal::SavedChunk& chunk,
                         void* out) const override {
    return base::CallTorch(absl::StatusCode::kInternal, absl::StrCat("reading ", key), [&] {
      const at::Tensor bytes = sources_[chunk.source_index].contiguous().cpu();
      std::memcpy(out, bytes.data_ptr(), bytes.nbytes());
    });
  }

 private:
  std::vector<at::Tensor> sources_;
};

// Appends `line` to `lines` unless it is there already (a value asked for twice, or by both
// passes of a strict load).
void RecordOnce(std::vector<std::string>& lines, const std::string& line) {
  if (std::find(lines.begin(), lines.end(), line) == lines.end()) lines.push_back(line);
}

}  // namespace

bool AbslParseFlag(absl::string_view text, SerializationFormat* out, std::string* error) {
  return base::ParseEnum(kSerializationFormats, text, out, error);
}

std::string AbslUnparseFlag(SerializationFormat format) {
  return std::string(base::EnumName(kSerializationFormats, format));
}

std::string LoadReport::ToString() const {
  std::vector<std::string> parts;
  if (!missing_keys.empty()) {
    parts.push_back(absl::StrCat("missing keys: ", absl::StrJoin(missing_keys, ", ")));
  }
  if (!unexpected_keys.empty()) {
    parts.push_back(absl::StrCat("unexpected keys: ", absl::StrJoin(unexpected_keys, ", ")));
  }
  for (const std::string& line : mismatches) parts.push_back(line);
  return absl::StrJoin(parts, "\n");
}

StateReader::StateReader(const internal::SavedState& saved, std::string scope, LoadReport& report,
                         bool checking)
    : saved_(saved), scope_(std::move(scope)), report_(report), checking_(checking) {}

std::vector<std::string> StateReader::TensorKeys() const {
  std::vector<std::string> keys;
  const std::string prefix = absl::StrCat(scope_, "/");
  for (auto it = saved_.tensors().lower_bound(prefix);
       it != saved_.tensors().end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it) {
    keys.push_back(it->first.substr(prefix.size()));
  }
  return keys;
}

const SavedTensorInfo* StateReader::FindTensor(const std::string& key) const {
  auto it = saved_.tensors().find(absl::StrCat(scope_, "/", key));
  return it == saved_.tensors().end() ? nullptr : &it->second.info;
}

absl::Status StateReader::ReadTensor(const std::string& key, const TensorRef& target) {
  const std::string full = absl::StrCat(scope_, "/", key);
  auto it = saved_.tensors().find(full);
  if (it == saved_.tensors().end()) {
    report_.missing_keys.push_back(full);
    return absl::OkStatus();
  }
  saved_.MarkRead(full);
  const internal::SavedTensor& saved = it->second;
  const at::Tensor& tensor = target.tensor;
  std::vector<int64_t> global, offsets;
  KEEL_RETURN_IF_ERROR(TargetBlock(full, target, global, offsets));
  if (saved.info.dtype != tensor.scalar_type()) {
    report_.mismatches.push_back(absl::StrCat(full, ": dtype ", c10::toString(saved.info.dtype),
                                              " in the checkpoint, ",
                                              c10::toString(tensor.scalar_type()), " here"));
    return absl::OkStatus();
  }
  if (saved.info.shape != global) {
    report_.mismatches.push_back(absl::StrCat(full, ": shape ", Shape(saved.info.shape),
                                              " in the checkpoint, ", Shape(global), " here"));
    return absl::OkStatus();
  }

  const std::vector<int64_t> local = tensor.sizes().vec();
  const int64_t rank = static_cast<int64_t>(local.size());
  at::NoGradGuard no_grad;
  int64_t covered = 0;
  for (const internal::SavedChunk& chunk : saved.chunks) {
    std::vector<int64_t> lo(rank), hi(rank);
    bool overlaps = true;
    for (int64_t d = 0; d < rank; ++d) {
      lo[d] = std::max(offsets[d], chunk.offsets[d]);
      hi[d] = std::min(offsets[d] + local[d], chunk.offsets[d] + chunk.lengths[d]);
      overlaps = overlaps && lo[d] < hi[d];
    }
    if (!overlaps) continue;
    const bool exact = chunk.offsets == offsets && chunk.lengths == local;
    if (checking_) {
      // Only the coverage below.
    } else if (exact && tensor.is_contiguous() && tensor.device().is_cpu()) {
      KEEL_RETURN_IF_ERROR(saved_.ReadChunk(full, chunk, tensor.data_ptr()));
    } else {
      const at::Tensor buffer = at::empty(chunk.lengths, at::TensorOptions().dtype(tensor.dtype()));
      KEEL_RETURN_IF_ERROR(saved_.ReadChunk(full, chunk, buffer.data_ptr()));
      KEEL_RETURN_IF_ERROR(
          base::CallTorch(absl::StatusCode::kInternal, absl::StrCat("copying ", full), [&] {
            at::Tensor dst = tensor;
            at::Tensor src = buffer;
            for (int64_t d = 0; d < rank; ++d) {
              dst = dst.narrow(d, lo[d] - offsets[d], hi[d] - lo[d]);
              src = src.narrow(d, lo[d] - chunk.offsets[d], hi[d] - lo[d]);
            }
            dst.copy_(src);
          }));
    }
    std::vector<int64_t> extent(rank);
    for (int64_t d = 0; d < rank; ++d) extent[d] = hi[d] - lo[d];
    covered += internal::Volume(extent);
  }
  if (covered != internal::Volume(local)) {
    return absl::DataLossError(absl::StrCat(full, ": the saved chunks cover ", covered, " of the ",
                                            internal::Volume(local), " elements of the block at ",
                                            Shape(offsets), " with shape ", Shape(local)));
  }
  return absl::OkStatus();
}

void StateReader::Skip(const std::string& key) { saved_.MarkRead(absl::StrCat(scope_, "/", key)); }

const base::Json& StateReader::Values() {
  static const base::Json* const kEmpty = new base::Json(base::Json::object());
  auto it = saved_.values().find(scope_);
  if (it == saved_.values().end()) {
    RecordOnce(report_.missing_keys, scope_);
    return *kEmpty;
  }
  const std::vector<base::Json>& values = it->second;
  if (values.size() == 1) return values[0];
  if (saved_.saved_world_size() == saved_.loading_world_size()) {
    return values[saved_.loading_rank()];
  }
  RecordOnce(
      report_.mismatches,
      absl::StrCat(scope_, ": its values differ per rank, saved by ", saved_.saved_world_size(),
                   " ranks and loaded by ", saved_.loading_world_size(),
                   ", and the object reads one rank's (StateReader::Values), not each "
                   "rank's to merge (ValuesOfEachRank)"));
  return *kEmpty;
}

bool StateReader::HasValues() const { return saved_.values().count(scope_) > 0; }

std::vector<base::Json> StateReader::ValuesOfEachRank() {
  std::optional<std::vector<base::Json>> values = saved_.ValuesOfEachRank(scope_);
  if (!values) RecordOnce(report_.missing_keys, scope_);
  return values.value_or(std::vector<base::Json>());
}

int StateReader::saved_world_size() const { return saved_.saved_world_size(); }

void StateReader::ReportMissing(const std::string& key) {
  report_.missing_keys.push_back(absl::StrCat(scope_, "/", key));
}

void StateReader::ReportUnexpected(const std::string& key) {
  report_.unexpected_keys.push_back(absl::StrCat(scope_, "/", key));
}

void StateReader::ReportMismatch(const std::string& line) {
  report_.mismatches.push_back(absl::StrCat(scope_, ": ", line));
}

namespace internal {

int64_t Volume(const std::vector<int64_t>& lengths) {
  int64_t volume = 1;
  for (int64_t length : lengths) volume *= length;
  return volume;
}

namespace {

absl::Status DoesNotFit(const LoadReport& report) {
  return absl::InvalidArgumentError(
      absl::StrCat("the checkpoint does not fit the state being loaded:\n", report.ToString()));
}

// One pass of every object's LoadStateDict (checking or for real), then what no object read
// (on any rank). A strict pass fails on what is missing or mismatched, agreed over the ranks.
absl::StatusOr<LoadReport> LoadPass(const Statefuls& statefuls, const SavedState& saved,
                                    bool checking, bool strict,
                                    const UnreadOnEveryRank& unread_on_every_rank) {
  LoadReport report;
  saved.ClearReads();
  absl::Status status;
  for (const auto& [name, stateful] : statefuls) {
    StateReader reader(saved, name, report, checking);
    status = stateful->LoadStateDict(reader);
    if (!status.ok()) {
      status = absl::Status(status.code(), absl::StrCat("loading ", name, ": ", status.message()));
      break;
    }
  }
  std::sort(report.missing_keys.begin(), report.missing_keys.end());
  std::vector<std::string> unread;
  for (const auto& [key, tensor] : saved.tensors()) {
    if (!saved.WasRead(key)) unread.push_back(key);
  }
  for (const auto& [name, values] : saved.values()) {
    if (statefuls.count(name) == 0) unread.push_back(name);
  }
  // What this rank finds wrong whatever the others read (the report then lists every key it
  // left unread), agreed with the other ranks.
  const bool wrong_here = strict && !report.clean();
  LoadReport with_unread = report;
  with_unread.unexpected_keys.insert(with_unread.unexpected_keys.end(), unread.begin(),
                                     unread.end());
  std::sort(with_unread.unexpected_keys.begin(), with_unread.unexpected_keys.end());
  if (status.ok() && wrong_here) status = DoesNotFit(with_unread);
  if (unread_on_every_rank) {
    KEEL_ASSIGN_OR_RETURN(unread, unread_on_every_rank(status, unread));
  }
  KEEL_RETURN_IF_ERROR(status);
  report.unexpected_keys.insert(report.unexpected_keys.end(), unread.begin(), unread.end());
  std::sort(report.unexpected_keys.begin(), report.unexpected_keys.end());
  return report;
}

}  // namespace

absl::StatusOr<LoadReport> LoadStatefuls(const Statefuls& statefuls, const SavedState& saved,
                                         const LoadOptions& options,
                                         const UnreadOnEveryRank& unread_on_every_rank) {
  if (options.strict) {
    // Nothing changes unless everything fits.
    KEEL_ASSIGN_OR_RETURN(LoadReport checked, LoadPass(statefuls, saved, /*checking=*/true,
                                                       options.strict, unread_on_every_rank));
    if (!checked.clean()) return DoesNotFit(checked);
  }
  KEEL_ASSIGN_OR_RETURN(LoadReport report, LoadPass(statefuls, saved, /*checking=*/false,
                                                    options.strict, unread_on_every_rank));
  if (options.strict && !report.clean()) return DoesNotFit(report);
  return report;
}

}  // namespace internal

absl::StatusOr<LoadReport> LoadFromMemory(const Statefuls& statefuls,
                                          const std::map<std::string, State>& saved,
                                          const LoadOptions& options) {
  MemorySavedState state(saved);
  return internal::LoadStatefuls(statefuls, state, options);
}

}  // namespace keel::checkpoint
