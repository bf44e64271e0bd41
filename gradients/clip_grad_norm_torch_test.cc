// NormAlgorithm::kForeach against torch.nn.utils.clip_grad_norm_ itself: the Python of the same
// PyTorch (@libtorch//:python) clips a table of gradient sets on the same device
// (clip_grad_norm_reference.py), and Keel must return the same norm and leave the same gradient
// bytes. --device=cuda runs it on the GPU (the gpu-tagged target).
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/Parallel.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "base/json.h"
#include "gmock/gmock.h"
#include "gradients/clip_grad_norm.h"
#include "gtest/gtest.h"
#include "testing/files.h"
#include "testing/status_matchers.h"
#include "torch/cuda.h"

ABSL_FLAG(std::string, python, "", "the Python of the LibTorch (@libtorch//:python)");
ABSL_FLAG(std::string, script, "", "clip_grad_norm_reference.py");
ABSL_FLAG(std::string, device, "cpu", "where both sides clip: cpu or cuda");

namespace keel::gradients {
namespace {

at::Tensor FromBytes(const std::string& bytes, const std::vector<int64_t>& shape,
                     at::ScalarType dtype) {
  at::Tensor t = at::empty(shape, dtype);
  EXPECT_EQ(static_cast<size_t>(t.nbytes()), bytes.size());
  if (static_cast<size_t>(t.nbytes()) == bytes.size() && !bytes.empty()) {
    std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  }
  return t;
}

double Hex(const base::Json& value) {
  return std::strtod(value.get<std::string>().c_str(), nullptr);
}

TEST(ClipGradNormTorchTest, ForeachEqualsPyTorchsClipGradNormBitForBit) {
  const std::string python = absl::GetFlag(FLAGS_python);
  if (auto why = keel::testing::WhyNotExecutable(python)) GTEST_SKIP() << *why;
  const at::Device device(absl::GetFlag(FLAGS_device));
  if (device.is_cuda() && !torch::cuda::is_available()) GTEST_SKIP() << "needs a GPU";
  at::set_num_threads(1);  // as the reference: a CPU reduction associates alike

  const std::string dir = keel::testing::NewTempDir("clip_reference");
  const std::string command = absl::StrCat(python, " ", absl::GetFlag(FLAGS_script),
                                           " --device=", device.str(), " --out=", dir);
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  KEEL_ASSERT_OK_AND_ASSIGN(base::Json reference, base::ReadJsonFile(dir + "/cases.json"));
  if (!reference["foreach"].get<bool>()) {
    GTEST_SKIP() << "torch " << reference["torch"].get<std::string>()
                 << "'s clip_grad_norm_ has no multi-tensor path, which kForeach follows";
  }
  ASSERT_FALSE(reference["cases"].empty());
  for (const base::Json& c : reference["cases"]) {
    const std::string name = c["name"].get<std::string>();
    SCOPED_TRACE(name);
    const at::ScalarType dtype = c["dtype"] == "bfloat16" ? at::kBFloat16 : at::kFloat;
    std::vector<NamedParameter> params;
    std::vector<at::Tensor> expected;
    for (size_t i = 0; i < c["shapes"].size(); ++i) {
      const std::vector<int64_t> shape = c["shapes"][i].get<std::vector<int64_t>>();
      const std::string stem = absl::StrCat(dir, "/", name);
      at::Tensor param = at::zeros(shape, at::TensorOptions(dtype).device(device));
      param.mutable_grad() =
          FromBytes(keel::testing::ReadFileOrFail(absl::StrCat(stem, ".in.", i)), shape, dtype)
              .to(device);
      params.push_back({absl::StrCat("w", i), param});
      expected.push_back(
          FromBytes(keel::testing::ReadFileOrFail(absl::StrCat(stem, ".out.", i)), shape, dtype));
    }
    ClipGradNormOptions options;
    options.norm_type = Hex(c["norm_type"]);
    options.algorithm = NormAlgorithm::kForeach;
    KEEL_ASSERT_OK_AND_ASSIGN(at::Tensor norm, ClipGradNorm(Hex(c["max_norm"]), params, options));
    EXPECT_EQ(norm.device().type(), device.type());  // "cuda" names the current GPU, cuda:0
    const double actual = norm.item<double>();
    const double want = Hex(c["norm"]);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(actual)) << actual;
    } else {
      EXPECT_EQ(actual, want) << "hex " << std::hexfloat << actual << " vs " << want;
    }
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor got = params[i].param.grad().cpu().contiguous();
      ASSERT_EQ(got.nbytes(), expected[i].nbytes());
      EXPECT_EQ(std::memcmp(got.data_ptr(), expected[i].data_ptr(), got.nbytes()), 0)
          << "gradient " << i << " differs from PyTorch's clipped bytes";
    }
  }
}

}  // namespace
}  // namespace keel::gradients
