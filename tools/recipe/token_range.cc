#include "tools/recipe/token_range.h"

#include <sys/stat.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "ATen/ATen.h"
#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "base/json.h"
#include "base/status.h"

namespace keel::tools::recipe {
namespace {

// Tokens read at a time by a scan.
constexpr int64_t kTokenChunk = int64_t{1} << 24;

struct TokenRange {
  int64_t min = 0;
  int64_t max = -1;
};

// What identifies the files a record describes: the prefix, and the .bin's and .idx's sizes
// and modification times (nanoseconds).
base::Json FileIdentity(const std::string& prefix) {
  base::Json identity = {{"dataset", prefix}};
  for (const char* suffix : {".bin", ".idx"}) {
    struct stat st {};
    const std::string path = prefix + suffix;
    if (::stat(path.c_str(), &st) != 0) return {};
    identity[absl::StrCat(suffix + 1, "_bytes")] = static_cast<int64_t>(st.st_size);
    identity[absl::StrCat(suffix + 1, "_mtime_ns")] =
        static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  }
  return identity;
}

// The recorded range, if the record describes these files.
std::optional<TokenRange> ReadRecord(const std::string& path, const base::Json& identity) {
  if (identity.is_null() || !base::PathExists(path)) return std::nullopt;
  absl::StatusOr<base::Json> record = base::ReadJsonFile(path);
  if (!record.ok() || !record->is_object()) return std::nullopt;
  for (const auto& [key, value] : identity.items()) {
    if (!record->contains(key) || (*record)[key] != value) return std::nullopt;
  }
  TokenRange range;
  if (!base::FromJson((*record)["min_token"], "min_token", range.min).ok() ||
      !base::FromJson((*record)["max_token"], "max_token", range.max).ok()) {
    return std::nullopt;
  }
  return range;
}

// Reads every token: their range, or an error naming the first outside [0, vocab_size).
absl::StatusOr<TokenRange> Scan(const sampling::IndexedDataset& dataset, const std::string& prefix,
                                int64_t vocab_size) {
  const int64_t item = sampling::TokenDtypeSize(dataset.dtype());
  TokenRange range{0, -1};
  bool any = false;
  const auto scan = [&](int64_t byte_offset, int64_t count) -> absl::Status {
    if (count == 0) return absl::OkStatus();
    const at::Tensor tokens = dataset.TokensAt(byte_offset, count).to(at::kLong);
    const int64_t low = tokens.min().item<int64_t>(), high = tokens.max().item<int64_t>();
    range = any ? TokenRange{std::min(range.min, low), std::max(range.max, high)}
                : TokenRange{low, high};
    any = true;
    if (low >= 0 && high < vocab_size) return absl::OkStatus();
    const int64_t bad = low < 0 ? low : high;
    const int64_t at = (tokens == bad).nonzero()[0][0].item<int64_t>();
    return absl::InvalidArgumentError(
        absl::StrCat("token ", bad, " of ", prefix, " (token ", byte_offset / item + at,
                     " of its .bin) is outside [0, model.vocab_size = ", vocab_size,
                     "): set model.vocab_size to cover the tokenizer's ids"));
  };
  if (dataset.contiguous()) {
    for (int64_t start = 0; start < dataset.num_tokens(); start += kTokenChunk) {
      KEEL_RETURN_IF_ERROR(scan(start * item, std::min(kTokenChunk, dataset.num_tokens() - start)));
    }
    return range;
  }
  for (int64_t i = 0; i < dataset.size(); ++i) {
    KEEL_RETURN_IF_ERROR(scan(dataset.sequence_pointer(i), dataset.sequence_length(i)));
  }
  return range;
}

}  // namespace

std::string TokenRangePath(const std::string& prefix, const std::string& cache_dir) {
  const size_t slash = prefix.find_last_of('/');
  return base::JoinPath(cache_dir,
                        absl::StrCat(slash == std::string::npos ? prefix : prefix.substr(slash + 1),
                                     ".token_range.json"));
}

absl::Status CheckTokenRange(const sampling::IndexedDataset& dataset, const std::string& prefix,
                             int64_t vocab_size, const std::string& cache_dir) {
  const std::string path = TokenRangePath(prefix, cache_dir);
  const base::Json identity = FileIdentity(prefix);
  if (const std::optional<TokenRange> recorded = ReadRecord(path, identity);
      recorded.has_value() && recorded->min >= 0 && recorded->max < vocab_size) {
    return absl::OkStatus();
  }
  KEEL_ASSIGN_OR_RETURN(const TokenRange range, Scan(dataset, prefix, vocab_size));
  if (identity.is_null()) return absl::OkStatus();
  base::Json record = identity;
  record["min_token"] = range.min;
  record["max_token"] = range.max;
  // Best effort: without the record the next launch scans again.
  if (base::MakeDirectories(cache_dir).ok()) {
    base::WriteFileAtomically(path, record.dump(1) + "\n").IgnoreError();
  }
  return absl::OkStatus();
}

}  // namespace keel::tools::recipe
