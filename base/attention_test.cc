// CausalAttention and SlidingWindowAttention against the explicit masked softmax; packed rows
// of several sequences (PackedCausalAttention) against each sequence attended alone; grouped
// key-value heads against the same heads repeated to the query heads. On the CPU and, where
// there is one, on a GPU (ATen's variable-length flash kernel, the grouped fused kernels).
#include "base/attention.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ATen/ATen.h"
#include "ATen/SDPBackend.h"
#include "ATen/core/grad_mode.h"
#include "base/attention_reference.h"
#include "gtest/gtest.h"

namespace keel::base {
namespace {

// q, k, v [2 batches, 3 heads, 37 positions, 16] from a fixed CPU generator, needing gradients.
std::vector<at::Tensor> Inputs(at::ScalarType dtype) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(/*seed_in=*/11);
  std::vector<at::Tensor> qkv;
  for (int i = 0; i < 3; ++i) {
    qkv.push_back(at::randn({2, 3, 37, 16}, generator, at::kFloat).to(dtype).requires_grad_(true));
  }
  return qkv;
}

TEST(CausalAttentionTest, IsTheMaskedSoftmaxItsOutputAndGradients) {
  const std::vector<at::Tensor> fused = Inputs(at::kFloat);
  const std::vector<at::Tensor> explicit_ = Inputs(at::kFloat);
  const at::Tensor out = CausalAttention(fused[0], fused[1], fused[2]);
  const at::Tensor expected = CausalAttentionExplicit(explicit_[0], explicit_[1], explicit_[2]);
  ASSERT_EQ(out.sizes(), expected.sizes());
  // Up to the order of the sums (the fused kernel goes over the keys in blocks).
  EXPECT_TRUE(at::allclose(out, expected, /*rtol=*/1e-5, /*atol=*/1e-6));
  const at::Tensor weights = at::linspace(-1, 1, out.numel()).view(out.sizes());
  (out * weights).sum().backward();
  (expected * weights).sum().backward();
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(at::allclose(fused[i].grad(), explicit_[i].grad(), /*rtol=*/1e-4, /*atol=*/1e-6))
        << "gradient of input " << i << ": max difference "
        << (fused[i].grad() - explicit_[i].grad()).abs().max().item<float>();
  }
}

// Position t sees positions 0..t only: changing keys and values from position 20 on leaves the
// outputs before it exactly as they were, and changes position 20's.
TEST(CausalAttentionTest, EachPositionSeesOnlyItselfAndEarlierOnes) {
  at::NoGradGuard no_grad;
  const std::vector<at::Tensor> qkv = Inputs(at::kFloat);
  const at::Tensor out = CausalAttention(qkv[0], qkv[1], qkv[2]);
  const at::Tensor k = qkv[1].clone(), v = qkv[2].clone();
  k.narrow(2, 20, 17).mul_(-3.0);
  v.narrow(2, 20, 17).add_(1.0);
  const at::Tensor changed = CausalAttention(qkv[0], k, v);
  EXPECT_TRUE(at::equal(changed.narrow(2, 0, 20), out.narrow(2, 0, 20)));
  EXPECT_FALSE(at::allclose(changed.select(2, 20), out.select(2, 20)));
}

// The first position attends to itself alone: its output is its own value.
TEST(CausalAttentionTest, TheFirstPositionIsItsOwnValue) {
  at::NoGradGuard no_grad;
  const std::vector<at::Tensor> qkv = Inputs(at::kFloat);
  for (const at::Tensor& out :
       {CausalAttention(qkv[0], qkv[1], qkv[2]), CausalAttentionExplicit(qkv[0], qkv[1], qkv[2])}) {
    EXPECT_TRUE(at::allclose(out.select(2, 0), qkv[2].select(2, 0), /*rtol=*/1e-6, /*atol=*/1e-7));
  }
}

// Within a window of 5, position t depends on keys and values t-4..t only: changing position
// 10 changes outputs 10..14 and no other; a window as long as the sequence is causal attention.
TEST(SlidingWindowAttentionTest, EachPositionSeesTheWindowBeforeIt) {
  at::NoGradGuard no_grad;
  const std::vector<at::Tensor> qkv = Inputs(at::kFloat);
  const at::Tensor out = SlidingWindowAttention(qkv[0], qkv[1], qkv[2], 5);
  const at::Tensor k = qkv[1].clone(), v = qkv[2].clone();
  k.select(2, 10).mul_(-3.0);
  v.select(2, 10).add_(1.0);
  const at::Tensor changed = SlidingWindowAttention(qkv[0], k, v, 5);
  const at::Tensor moved = (changed - out).abs().amax({0, 1, 3});  // per position
  for (int64_t t = 0; t < 37; ++t) {
    EXPECT_EQ(moved[t].item<float>() > 0, t >= 10 && t < 15) << "position " << t;
  }
  // Position 4 sees 0..4 whatever the window beyond 5; position 20 sees 16..20 in a window of 5.
  EXPECT_TRUE(at::allclose(out.narrow(2, 0, 5),
                           CausalAttention(qkv[0], qkv[1], qkv[2]).narrow(2, 0, 5), 1e-5, 1e-6));
  const at::Tensor window20 =
      CausalAttention(qkv[0].narrow(2, 16, 5), qkv[1].narrow(2, 16, 5), qkv[2].narrow(2, 16, 5));
  EXPECT_TRUE(at::allclose(out.select(2, 20), window20.select(2, 4), 1e-5, 1e-6));
  EXPECT_TRUE(at::equal(SlidingWindowAttention(qkv[0], qkv[1], qkv[2], 37),
                        CausalAttention(qkv[0], qkv[1], qkv[2])));
}

TEST(PackRowsTest, OffsetsPositionsAndThePaddingSequence) {
  const PackedSequences packed = PackRows({{3, 0, 2}, {6}, {1, 4}}, 6);
  const std::vector<int32_t> offsets(packed.cu_seqlens.data_ptr<int32_t>(),
                                     packed.cu_seqlens.data_ptr<int32_t>() + 7);
  // Row 0: 3, 2 and a padding of 1; row 1 full; row 2: 1, 4 and a padding of 1.
  EXPECT_EQ(offsets, (std::vector<int32_t>{0, 3, 5, 6, 12, 13, 17}));
  EXPECT_EQ(packed.cu_seqlens.numel(), 8);
  EXPECT_EQ(packed.cu_seqlens[7].item<int32_t>(), 18);
  EXPECT_EQ(packed.max_seqlen, 6);
  EXPECT_TRUE(at::equal(
      packed.position_ids,
      at::tensor({0, 1, 2, 0, 1, 0, 0, 1, 2, 3, 4, 5, 0, 0, 1, 2, 3, 0}, at::kLong).view({3, 6})));
}

// The sequences of PackRows({{5, 7, 9}, {21}, {4, 10, 3}}, 24): each row's padding is one
// more sequence.
PackedSequences ThreeRows() { return PackRows({{5, 7, 9}, {21}, {4, 10, 3}}, 24); }

// q, k, v [3 rows, 2 heads, 24 positions, 8] from a fixed generator, needing gradients.
std::vector<at::Tensor> PackedInputs(const at::TensorOptions& options) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(/*seed_in=*/5);
  std::vector<at::Tensor> qkv;
  for (int i = 0; i < 3; ++i) {
    qkv.push_back(at::randn({3, 2, 24, 8}, generator, at::kFloat).to(options).requires_grad_(true));
  }
  return qkv;
}

// Each sequence of `packed` attended alone by the explicit masked softmax (within `window`
// positions, when positive), its own batch: the expected output of packed rows.
at::Tensor EachAlone(const std::vector<at::Tensor>& qkv, const PackedSequences& packed,
                     int64_t window) {
  const at::Tensor offsets = packed.cu_seqlens.to(at::kLong).cpu();
  const int64_t seq = qkv[0].size(2);
  std::vector<at::Tensor> rows(qkv[0].size(0));
  std::vector<std::vector<at::Tensor>> pieces(rows.size());
  for (int64_t i = 0; i + 1 < offsets.numel(); ++i) {
    const int64_t begin = offsets[i].item<int64_t>(),
                  length = offsets[i + 1].item<int64_t>() - begin;
    std::vector<at::Tensor> part;
    for (const at::Tensor& x : qkv) {
      part.push_back(x.narrow(0, begin / seq, 1).narrow(2, begin % seq, length).contiguous());
    }
    at::Tensor out;
    if (window == 0) {
      out = CausalAttentionExplicit(part[0], part[1], part[2]);
    } else {  // the window's positions, each attended alone
      std::vector<at::Tensor> each;
      for (int64_t t = 0; t < length; ++t) {
        const int64_t first = std::max<int64_t>(0, t - window + 1);
        each.push_back(CausalAttentionExplicit(part[0].narrow(2, first, t + 1 - first),
                                               part[1].narrow(2, first, t + 1 - first),
                                               part[2].narrow(2, first, t + 1 - first))
                           .narrow(2, t - first, 1));
      }
      out = at::cat(each, 2);
    }
    pieces[begin / seq].push_back(out);
  }
  for (size_t r = 0; r < rows.size(); ++r) rows[r] = at::cat(pieces[r], 2);
  return at::cat(rows, 0);
}

void ExpectPackedIsEachAlone(const at::TensorOptions& options, int64_t window, double rtol,
                             double atol) {
  const PackedSequences packed = ThreeRows().To(options.device());
  const std::vector<at::Tensor> fused = PackedInputs(options);
  const std::vector<at::Tensor> alone = PackedInputs(options);
  const at::Tensor out = PackedCausalAttention(fused[0], fused[1], fused[2], packed, window);
  const at::Tensor expected = EachAlone(alone, packed, window);
  ASSERT_EQ(out.sizes(), expected.sizes());
  EXPECT_TRUE(at::allclose(out.to(at::kFloat), expected.to(at::kFloat), rtol, atol))
      << "max difference " << (out - expected).abs().max().item<float>();
  const at::Tensor weights = at::linspace(-1, 1, out.numel(), options).view(out.sizes());
  (out * weights).sum().backward();
  (expected * weights).sum().backward();
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(at::allclose(fused[i].grad().to(at::kFloat), alone[i].grad().to(at::kFloat),
                             10 * rtol, 10 * atol))
        << "gradient of input " << i << ": max difference "
        << (fused[i].grad() - alone[i].grad()).abs().max().item<float>();
  }
}

TEST(PackedCausalAttentionTest, EachSequenceAttendsAsIfAlone) {
  ExpectPackedIsEachAlone(at::kFloat, /*window=*/0, 1e-5, 1e-6);
}

TEST(PackedCausalAttentionTest, WithinASlidingWindowToo) {
  ExpectPackedIsEachAlone(at::kFloat, /*window=*/4, 1e-5, 1e-6);
}

// Changing the keys and values of the second sequence of row 0 (positions 5..11) changes its
// outputs and leaves every other position's exactly as it was.
TEST(PackedCausalAttentionTest, NothingCrossesASequence) {
  at::NoGradGuard no_grad;
  const std::vector<at::Tensor> qkv = PackedInputs(at::kFloat);
  const PackedSequences packed = ThreeRows();
  const at::Tensor out = PackedCausalAttention(qkv[0], qkv[1], qkv[2], packed, 0);
  const at::Tensor k = qkv[1].clone(), v = qkv[2].clone();
  k[0].narrow(1, 5, 7).mul_(-3.0);
  v[0].narrow(1, 5, 7).add_(1.0);
  const at::Tensor moved =
      (PackedCausalAttention(qkv[0], k, v, packed, 0) - out).abs().amax({1, 3});  // [row, seq]
  for (int64_t r = 0; r < 3; ++r) {
    for (int64_t t = 0; t < 24; ++t) {
      EXPECT_EQ(moved[r][t].item<float>() > 0, r == 0 && t >= 5 && t < 12)
          << "row " << r << ", position " << t;
    }
  }
}

// ATen's variable-length flash kernel in bf16, against the sequences attended alone.
TEST(PackedCausalAttentionTest, OnAGpuThroughTheVariableLengthFlashKernel) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no GPU on this machine: the flash path is not run";
  const auto options = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  ExpectPackedIsEachAlone(options, /*window=*/0, 2e-2, 2e-2);
  ExpectPackedIsEachAlone(options, /*window=*/4, 2e-2, 2e-2);
}

// Grouped-query attention: q [2, 6 heads, 29, 16], k and v [2, 2 heads, 29, 16] against k and v
// repeated to the query heads (HF's repeat_kv: query heads 0-2 read key-value head 0), the
// outputs and the gradients (a key-value head's sums its query heads').
using Attention =
    std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>;

void ExpectGroupedIsRepeated(const at::TensorOptions& options, const Attention& attend, double rtol,
                             double atol) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(/*seed_in=*/13);
  const at::Tensor q0 = at::randn({2, 6, 29, 16}, generator).to(options);
  const at::Tensor k0 = at::randn({2, 2, 29, 16}, generator).to(options);
  const at::Tensor v0 = at::randn({2, 2, 29, 16}, generator).to(options);
  const at::Tensor upstream = at::randn({2, 6, 29, 16}, generator).to(options);
  std::vector<at::Tensor> grouped, repeated;
  for (const at::Tensor& x : {q0, k0, v0}) {
    grouped.push_back(x.clone().requires_grad_());
    repeated.push_back(x.clone().requires_grad_());
  }
  const at::Tensor out = attend(grouped[0], grouped[1], grouped[2]);
  const at::Tensor expected =
      attend(repeated[0], repeated[1].repeat_interleave(3, 1), repeated[2].repeat_interleave(3, 1));
  ASSERT_EQ(out.sizes(), expected.sizes());
  EXPECT_TRUE(at::allclose(out.to(at::kFloat), expected.to(at::kFloat), rtol, atol))
      << "max difference " << (out - expected).abs().max().item<float>();
  out.backward(upstream);
  expected.backward(upstream);
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(at::allclose(grouped[i].grad().to(at::kFloat), repeated[i].grad().to(at::kFloat),
                             10 * rtol, 10 * atol))
        << "gradient of input " << i << ": max difference "
        << (grouped[i].grad() - repeated[i].grad()).abs().max().item<float>();
  }
}

// Causal, within a window of 5, and packed ({9, 12} and the padding in row 0, {29} in row 1).
void ExpectEveryAttentionGroups(const at::TensorOptions& options, double rtol, double atol) {
  const PackedSequences packed = PackRows({{9, 12}, {29}}, 29).To(options.device());
  ExpectGroupedIsRepeated(options, CausalAttention, rtol, atol);
  ExpectGroupedIsRepeated(
      options,
      [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
        return SlidingWindowAttention(q, k, v, /*window=*/5);
      },
      rtol, atol);
  ExpectGroupedIsRepeated(
      options,
      [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
        return PackedCausalAttention(q, k, v, packed, /*window=*/0);
      },
      rtol, atol);
}

TEST(GroupedQueryAttentionTest, IsAttentionOverKeysAndValuesRepeatedToTheQueryHeads) {
  ExpectEveryAttentionGroups(at::kFloat, 1e-5, 1e-6);
}

TEST(GroupedQueryAttentionTest, RefusesKeyValueHeadsThatDoNotDivideTheQueryHeads) {
  const at::Tensor q = at::randn({1, 6, 4, 8}), kv = at::randn({1, 4, 4, 8});
  try {
    CausalAttention(q, kv, kv);
    ADD_FAILURE() << "4 key-value heads over 6 query heads were taken";
  } catch (const c10::Error& error) {
    EXPECT_NE(std::string(error.what_without_backtrace())
                  .find("(4, 4) must be equal and divide the query heads (6)"),
              std::string::npos)
        << error.what_without_backtrace();
  }
}

// On a GPU in bf16 the fused kernels take the groups as they are: no repeated keys and values.
TEST(GroupedQueryAttentionTest, OnAGpuTheFusedKernelTakesTheGroups) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no GPU on this machine: the grouped kernels are not run";
  const auto options = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
  const at::Tensor q = at::randn({2, 6, 128, 64}, options),
                   kv = at::randn({2, 2, 128, 64}, options);
  const int64_t backend = at::_fused_sdp_choice(q, kv, kv, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                                /*is_causal=*/true, /*scale=*/std::nullopt,
                                                /*enable_gqa=*/true);
  EXPECT_NE(backend, static_cast<int64_t>(at::SDPBackend::math));
  ExpectEveryAttentionGroups(options, 2e-2, 2e-2);
}

}  // namespace
}  // namespace keel::base
