#include "sampling/gpt_dataset_config.h"

#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/enum.h"
#include "base/status.h"
#include "sampling/numpy_random.h"

namespace keel::sampling {
namespace {

using base::Json;

constexpr base::EnumSpelling<Split> kSplitSpellings[] = {
    {Split::kTrain, "train"},
    {Split::kValid, "valid"},
    {Split::kTest, "test"},
};

// numpy's pairwise summation of float64 (numpy/core/src/umath/loops_utils.h.src): blocks of
// up to 128 in eight accumulators, larger ranges halved at a multiple of 8.
double PairwiseSum(const double* a, size_t n) {
  if (n < 8) {
    double sum = 0.0;
    for (size_t i = 0; i < n; ++i) sum += a[i];
    return sum;
  }
  if (n <= 128) {
    double r[8];
    for (int k = 0; k < 8; ++k) r[k] = a[k];
    size_t i = 8;
    for (; i < n - n % 8; i += 8) {
      for (int k = 0; k < 8; ++k) r[k] += a[i + k];
    }
    double sum = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) sum += a[i];
    return sum;
  }
  size_t half = n / 2;
  half -= half % 8;
  return PairwiseSum(a, half) + PairwiseSum(a + half, n - half);
}

absl::Status CheckBlend(const Blend& blend, absl::string_view what) {
  if (blend.prefixes.empty() || blend.prefixes.size() >= 32767) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " holds ", blend.prefixes.size(), " prefixes; allowed: 1 to 32766"));
  }
  if (!blend.weights.has_value()) return absl::OkStatus();
  if (blend.weights->size() != blend.prefixes.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": prefixes and weights must be equal in number (",
                     blend.prefixes.size(), " prefixes, ", blend.weights->size(), " weights)"));
  }
  for (size_t i = 0; i < blend.prefixes.size(); ++i) {
    const double w = (*blend.weights)[i];
    if (!(w > 0) || !std::isfinite(w)) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": the weight of ", blend.prefixes[i],
                                                     " (", w, ") must be finite and > 0"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckBlends(const GptDatasetConfig& c) {
  const bool per_split = c.blend_per_split.has_value() &&
                         std::any_of(c.blend_per_split->begin(), c.blend_per_split->end(),
                                     [](const auto& b) { return b.has_value(); });
  if (per_split) {
    if (c.blend.has_value()) {
      return absl::InvalidArgumentError("blend and blend_per_split are incompatible");
    }
    if (c.split.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("split (\"", *c.split, "\") and blend_per_split are incompatible"));
    }
    if (c.blend_per_split->size() != 3) {
      return absl::InvalidArgumentError(
          absl::StrCat("blend_per_split holds ", c.blend_per_split->size(),
                       " blends; it must hold 3 (train, valid, test)"));
    }
    for (Split split : kSplits) {
      const auto& blend = (*c.blend_per_split)[static_cast<int>(split)];
      if (blend.has_value()) {
        KEEL_RETURN_IF_ERROR(CheckBlend(*blend, "blend_per_split " + AbslUnparseFlag(split)));
      }
    }
    return absl::OkStatus();
  }
  if (!c.blend.has_value()) {
    return absl::InvalidArgumentError(
        "neither blend nor blend_per_split is set (Keel has no mock datasets)");
  }
  KEEL_RETURN_IF_ERROR(CheckBlend(*c.blend, "blend"));
  if (!c.split.has_value()) {
    return absl::InvalidArgumentError("split must be provided when blend is set");
  }
  return absl::OkStatus();
}

absl::Status CheckGpt(const GptDatasetConfig& c) {
  for (auto [name, value] : {std::pair{"reset_position_ids", c.reset_position_ids},
                             {"reset_attention_mask", c.reset_attention_mask},
                             {"eod_mask_loss", c.eod_mask_loss}}) {
    if (!value.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(name, " must be set (true or false)"));
    }
  }
  if (*c.reset_position_ids || *c.reset_attention_mask) {
    return absl::InvalidArgumentError(
        "reset_position_ids and reset_attention_mask must be false: Keel's GPT samples carry no "
        "position ids or attention mask");
  }
  if (c.sequence_length < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence_length (", c.sequence_length, ") must be > 1"));
  }
  if (!(c.mid_level_dataset_surplus >= 0) || !std::isfinite(c.mid_level_dataset_surplus)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mid_level_dataset_surplus (", c.mid_level_dataset_surplus, ") must be finite and >= 0"));
  }
  return NumpyRandomState::Create(c.random_seed).status();
}

}  // namespace

bool AbslParseFlag(absl::string_view text, Split* out, std::string* error) {
  return base::ParseEnum(kSplitSpellings, text, out, error);
}

std::string AbslUnparseFlag(Split split) {
  return std::string(base::EnumName(kSplitSpellings, split));
}

absl::Status FromJson(const Json& json, absl::string_view what, Blend& out) {
  if (!json.is_array() || json.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " must be [prefixes, weights or null], got ", json.dump()));
  }
  KEEL_RETURN_IF_ERROR(base::FromJson(json[0], absl::StrCat(what, "[0]"), out.prefixes));
  return base::FromJson(json[1], absl::StrCat(what, "[1]"), out.weights);
}

Json ToJson(const Blend& blend) {
  return Json::array({base::ToJson(blend.prefixes), base::ToJson(blend.weights)});
}

absl::Status FromJson(const Json& json, absl::string_view what, GptTokenizer& out) {
  if (!json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " must be a JSON object"));
  }
  const auto read = [&](const char* key, std::optional<int64_t>& field) {
    return base::FromJson(json.value(key, Json()), absl::StrCat(what, ".", key), field);
  };
  KEEL_RETURN_IF_ERROR(read("vocab_size", out.vocab_size));
  KEEL_RETURN_IF_ERROR(read("eod", out.eod));
  KEEL_RETURN_IF_ERROR(read("pad", out.pad));
  out.unique_identifiers = json.value("unique_identifiers", Json::object());
  return absl::OkStatus();
}

Json ToJson(const GptTokenizer& tokenizer) {
  return {{"vocab_size", base::ToJson(tokenizer.vocab_size)},
          {"eod", base::ToJson(tokenizer.eod)},
          {"pad", base::ToJson(tokenizer.pad)},
          {"unique_identifiers", tokenizer.unique_identifiers}};
}

std::vector<double> Normalize(absl::Span<const double> weights) {
  const double sum = PairwiseSum(weights.data(), weights.size());
  std::vector<double> normalized;
  for (double w : weights) normalized.push_back(w / sum);
  return normalized;
}

absl::StatusOr<std::vector<double>> ParseAndNormalizeSplit(absl::string_view split) {
  const auto refuse = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "split \"", split, "\" ", why,
        "; allowed: up to 3 non-negative decimal numbers separated by anything but letters and "
        "signs, e.g. \"969,30,1\" or \"8/1/1\""));
  };
  // Megatron's re.findall("[.0-9]+") reads any other character as a separator; a letter or a
  // sign would change what a number means ("1e2", "-20"), so those are refused instead.
  const auto separates = [](char c) {
    return !absl::ascii_isdigit(c) && c != '.' && !absl::ascii_isalpha(c) && c != '-' && c != '+';
  };
  std::vector<double> weights;
  for (size_t i = 0; i < split.size();) {
    if (separates(split[i])) {
      ++i;
      continue;
    }
    size_t end = i;
    while (end < split.size() && (absl::ascii_isdigit(split[end]) || split[end] == '.')) ++end;
    if (end == i) return refuse(absl::StrCat("holds '", split.substr(i, 1), "'"));
    double weight;
    if (!absl::SimpleAtod(split.substr(i, end - i), &weight)) {
      return refuse(absl::StrCat("holds \"", split.substr(i, end - i), "\""));
    }
    weights.push_back(weight);
    i = end;
  }
  if (weights.size() > 3) return refuse(absl::StrCat("has ", weights.size(), " numbers"));
  weights.resize(3, 0.0);
  if (!(PairwiseSum(weights.data(), 3) > 0)) return refuse("sums to 0");
  return Normalize(weights);
}

SplitMatrix ConvertSplitVectorToSplitMatrix(absl::Span<const double> vector) {
  std::vector<double> bookends = {0.0};
  for (double v : vector) bookends.push_back(bookends.back() + v);
  SplitMatrix matrix;
  for (size_t i = 0; i < matrix.size() && i + 1 < bookends.size(); ++i) {
    if (bookends[i + 1] > bookends[i]) matrix[i] = std::pair{bookends[i], bookends[i + 1]};
  }
  return matrix;
}

absl::StatusOr<Blend> GetBlendFromList(const std::vector<std::string>& items) {
  if (items.empty()) return absl::InvalidArgumentError("the blend list is empty");
  Blend blend;
  std::vector<double> weights;
  size_t numbers = 0;
  for (size_t i = 0; i < items.size(); i += 2) {
    double weight;
    if (absl::SimpleAtod(absl::StripAsciiWhitespace(items[i]), &weight)) ++numbers;
    weights.push_back(weight);
  }
  const bool zipped = items.size() % 2 == 0 && numbers == weights.size();
  if (numbers > 0 && !zipped) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the blend list \"", absl::StrJoin(items, " "),
        "\" mixes weights and prefixes; allowed: \"prefix ...\" or \"weight prefix ...\""));
  }
  for (size_t i = zipped ? 1 : 0; i < items.size(); i += zipped ? 2 : 1) {
    blend.prefixes.push_back(std::string(absl::StripAsciiWhitespace(items[i])));
  }
  if (zipped) blend.weights = std::move(weights);
  return blend;
}

absl::StatusOr<std::optional<SplitMatrix>> ValidateGptDatasetConfig(
    const GptDatasetConfig& config) {
  KEEL_RETURN_IF_ERROR(CheckBlends(config));
  KEEL_RETURN_IF_ERROR(CheckGpt(config));
  if (!config.blend.has_value()) return std::optional<SplitMatrix>();
  KEEL_ASSIGN_OR_RETURN(std::vector<double> vector, ParseAndNormalizeSplit(*config.split));
  return std::optional<SplitMatrix>(ConvertSplitVectorToSplitMatrix(vector));
}

}  // namespace keel::sampling
