// Fuzzes the reading of a Hugging Face config.json (base::ParseJson, then HfConfigToOptions): an
// input is the file's bytes. The text must be refused with kInvalidArgument or parse; a parsed
// file must be refused with kInvalidArgument or kDataLoss, or give options that the way back
// (OptionsToHfConfig) writes as a config.json that reads as the same options. A broken promise
// traps; a throw or a stack overflow ends the process all the same.
//
// Built by Bazel with gcc, this file is a test that runs the entry point over a generated
// corpus (the fixtures' files, their truncations, byte and value mutations, and random bytes).
// To fuzz with libFuzzer (Debian: clang, libclang-rt-14-dev), from the repository root:
//
//   TORCH=.venv/lib/python3.11/site-packages/torch
//   clang++ -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -DKEEL_LIBFUZZER -I.
//       -isystem $TORCH/include models/hf_config_fuzz_test.cc models/hf_config.cc
//       models/model_options.cc base/json.cc base/files.cc parallel/recompute.cc
//       -L$TORCH/lib -Wl,-rpath,$PWD/$TORCH/lib -ltorch -ltorch_cpu -lc10 -labsl_statusor
//       -labsl_status -labsl_strings -labsl_int128 -labsl_throw_delegate
//       -labsl_raw_logging_internal -labsl_str_format_internal -labsl_cord -labsl_cordz_info
//       -labsl_cord_internal -o /tmp/hf_config_fuzzer
//   mkdir -p /tmp/hf_config_corpus
//   for f in testdata/hf_parity/*/config.json; do cp $f /tmp/hf_config_corpus/${RANDOM}.json; done
//   ASAN_OPTIONS=detect_leaks=0 /tmp/hf_config_fuzzer -max_total_time=60 /tmp/hf_config_corpus
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/json.h"
#include "models/hf_config.h"
#include "models/model_options.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace models = keel::models;
  const auto require = [](bool promise) {
    if (!promise) __builtin_trap();
  };
  absl::StatusOr<keel::base::Json> json =
      keel::base::ParseJson(std::string(reinterpret_cast<const char*>(data), size));
  if (!json.ok()) {
    require(json.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  absl::StatusOr<models::ModelOptions> options = models::HfConfigToOptions(*json, "config.json");
  if (!options.ok()) {
    require(options.status().code() == absl::StatusCode::kInvalidArgument ||
            options.status().code() == absl::StatusCode::kDataLoss);
    return 0;
  }
  absl::StatusOr<keel::base::Json> written =
      models::OptionsToHfConfig(*options, "float32", keel::base::Json::object());
  require(written.ok());
  absl::StatusOr<models::ModelOptions> again = models::HfConfigToOptions(*written, "written");
  require(again.ok() &&
          keel::base::WriteJsonFields(*again) == keel::base::WriteJsonFields(*options));
  return 0;
}

#ifndef KEEL_LIBFUZZER
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "base/files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace keel::models {
namespace {

struct Tally {
  int accepted = 0;
  int rejected = 0;
};

void RunInput(const std::string& input, Tally& tally) {
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
  absl::StatusOr<base::Json> json = base::ParseJson(input);
  ++(json.ok() && HfConfigToOptions(*json, "c").ok() ? tally.accepted : tally.rejected);
}

// Each JSON value of `text` (a number, true, false, null, a string) replaced by each of
// `values` in turn.
std::vector<std::string> ValueMutations(const std::string& text,
                                        const std::vector<std::string>& values) {
  std::vector<std::string> out;
  for (size_t colon = text.find(':'); colon != std::string::npos;
       colon = text.find(':', colon + 1)) {
    size_t begin = text.find_first_not_of(" \n", colon + 1);
    if (begin == std::string::npos || text[begin] == '{' || text[begin] == '[') continue;
    size_t end = text.find_first_of(",}\n", begin);
    if (text[begin] == '"') end = text.find('"', begin + 1) + 1;
    for (const std::string& value : values) {
      out.push_back(absl::StrCat(text.substr(0, begin), value, text.substr(end)));
    }
  }
  return out;
}

TEST(HfConfigFuzzTest, SurvivesTheCorpus) {
  std::vector<std::string> seeds;
  for (const char* name :
       {"llama_tied", "llama_gqa_untied", "llama_legacy_rope", "qwen2", "qwen3", "mistral"}) {
    absl::StatusOr<std::string> text =
        base::ReadFile(absl::StrCat("testdata/hf_parity/", name, "/config.json"));
    ASSERT_TRUE(text.ok()) << text.status();
    seeds.push_back(*text);
  }
  const std::string deep = std::string(5000, '[') + std::string(5000, ']');
  const std::vector<std::string> values = {"0",
                                           "-1",
                                           "1",
                                           "2147483648",
                                           "18446744073709551615",
                                           "-9223372036854775809",
                                           "1e400",
                                           "-1e400",
                                           "1e-400",
                                           "0.5",
                                           "1.5e300",
                                           "null",
                                           "true",
                                           "\"x\"",
                                           "[]",
                                           "{}",
                                           "[1]",
                                           "{\"rope_type\": \"llama3\"}",
                                           deep,
                                           "\"\\ud800\"",
                                           "\"\xff\""};
  Tally tally;
  std::mt19937_64 random(20261129);
  for (const std::string& seed : seeds) {
    RunInput(seed, tally);
    for (size_t size = 0; size < seed.size(); size += 7) RunInput(seed.substr(0, size), tally);
    for (const std::string& mutated : ValueMutations(seed, values)) RunInput(mutated, tally);
    for (int i = 0; i < 300; ++i) {
      std::string mutated = seed;
      for (int edits = 1 + random() % 3; edits > 0; --edits) {
        constexpr char kBytes[] = "0123456789[]{},:\"-.eE \\n";
        mutated[random() % mutated.size()] = kBytes[random() % (sizeof(kBytes) - 1)];
      }
      RunInput(mutated, tally);
    }
  }
  for (int i = 0; i < 300; ++i) {
    std::string noise(random() % 100, '\0');
    constexpr char kBytes[] = "{}[]:,\"0123456789.eE-tnulrfas \\";
    for (char& c : noise) c = kBytes[random() % (sizeof(kBytes) - 1)];
    RunInput(noise, tally);
  }
  // The corpus reaches both outcomes; each accepted file passed the way back.
  EXPECT_GT(tally.accepted, 100);
  EXPECT_GT(tally.rejected, 1000);
}

}  // namespace
}  // namespace keel::models
#endif  // KEEL_LIBFUZZER
