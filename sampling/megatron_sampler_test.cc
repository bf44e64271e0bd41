#include "sampling/megatron_sampler.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ATen/CPUGeneratorImpl.h"
#include "ATen/ops/randperm.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/status_matchers.h"

namespace keel::sampling {
namespace {

using ::keel::testing::IsOk;
using ::keel::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::NotNull;
using ::testing::SizeIs;
using Batches = std::vector<std::vector<int64_t>>;

constexpr auto kInvalidArgument = absl::StatusCode::kInvalidArgument;

PretrainingSamplerOptions Options(int64_t total, int64_t mbs, int64_t dp, int64_t rank = 0) {
  PretrainingSamplerOptions o;
  o.total_samples = total;
  o.micro_batch_size = mbs;
  o.data_parallel_size = dp;
  o.data_parallel_rank = rank;
  return o;
}

std::unique_ptr<MegatronPretrainingSampler> Sequential(const PretrainingSamplerOptions& o) {
  auto sampler = MegatronPretrainingSampler::Create(o);
  EXPECT_THAT(sampler, IsOk());
  return sampler.ok() ? std::move(sampler).value() : nullptr;
}

std::unique_ptr<MegatronPretrainingRandomSampler> Random(const PretrainingSamplerOptions& o) {
  auto sampler = MegatronPretrainingRandomSampler::Create(o);
  EXPECT_THAT(sampler, IsOk());
  return sampler.ok() ? std::move(sampler).value() : nullptr;
}

// One pass, or its first `take` micro-batches (the pass is then abandoned).
Batches Pass(MegatronSampler& sampler, int64_t take = -1) {
  Batches batches;
  if (take == 0) return batches;
  auto it = sampler.begin();
  for (; it != sampler.end(); ++it) {
    batches.push_back(*it);
    if (static_cast<int64_t>(batches.size()) == take) break;
  }
  return batches;
}

std::vector<int64_t> Flatten(const Batches& batches) {
  std::vector<int64_t> out;
  for (const auto& b : batches) out.insert(out.end(), b.begin(), b.end());
  return out;
}

// ---------------------------------------------------------------------------------------
// Validation: every rule of the reference, by field name.

TEST(MegatronSamplerValidationTest, RejectsNoSamples) {
  EXPECT_THAT(MegatronPretrainingSampler::Create(Options(0, 1, 1)),
              StatusIs(kInvalidArgument, HasSubstr("total_samples (0) must be > 0")));
  EXPECT_THAT(MegatronPretrainingRandomSampler::Create(Options(-3, 1, 1)),
              StatusIs(kInvalidArgument, HasSubstr("total_samples (-3)")));
}

TEST(MegatronSamplerValidationTest, RejectsNonPositiveMicroBatchSize) {
  EXPECT_THAT(MegatronPretrainingSampler::Create(Options(10, 0, 1)),
              StatusIs(kInvalidArgument, HasSubstr("micro_batch_size (0) must be > 0")));
  EXPECT_THAT(MegatronPretrainingRandomSampler::Create(Options(10, -1, 1)),
              StatusIs(kInvalidArgument, HasSubstr("micro_batch_size (-1)")));
}

TEST(MegatronSamplerValidationTest, RejectsNonPositiveDataParallelSize) {
  EXPECT_THAT(MegatronPretrainingSampler::Create(Options(10, 1, 0)),
              StatusIs(kInvalidArgument, HasSubstr("data_parallel_size (0) must be > 0")));
}

TEST(MegatronSamplerValidationTest, RejectsRankOutOfRange) {
  EXPECT_THAT(MegatronPretrainingSampler::Create(Options(10, 1, 2, /*rank=*/2)),
              StatusIs(kInvalidArgument,
                       HasSubstr("data_parallel_rank (2) must be in [0, data_parallel_size (2))")));
  // The reference checks only rank >= size; a negative rank would slice nothing.
  EXPECT_THAT(MegatronPretrainingRandomSampler::Create(Options(10, 1, 2, /*rank=*/-1)),
              StatusIs(kInvalidArgument, HasSubstr("data_parallel_rank (-1)")));
}

TEST(MegatronSamplerValidationTest, RejectsGlobalBatchNotDivisible) {
  PretrainingSamplerOptions o = Options(100, 2, 3);
  o.global_batch_size = 8;  // not a multiple of 2 x 3
  EXPECT_THAT(MegatronPretrainingSampler::Create(o),
              StatusIs(kInvalidArgument, HasSubstr("global_batch_size (8) must be divisible by "
                                                   "micro_batch_size (2) x data_parallel_size "
                                                   "(3) = 6")));
  EXPECT_THAT(MegatronPretrainingRandomSampler::Create(o),
              StatusIs(kInvalidArgument, HasSubstr("global_batch_size (8)")));
}

TEST(MegatronSamplerValidationTest, RejectsNonPositiveGlobalBatch) {
  // The reference accepts these and then divides by zero (0) or returns a meaningless len.
  for (int64_t gbs : {0, -4}) {
    SCOPED_TRACE(gbs);
    PretrainingSamplerOptions o = Options(100, 2, 2);
    o.global_batch_size = gbs;
    EXPECT_THAT(MegatronPretrainingSampler::Create(o),
                StatusIs(kInvalidArgument,
                         HasSubstr(absl::StrCat("global_batch_size (", gbs, ") must be > 0"))));
  }
}

TEST(MegatronSamplerValidationTest, RejectsPaddingWithoutGlobalBatch) {
  PretrainingSamplerOptions o = Options(10, 2, 1);
  o.drop_last = false;
  o.pad_samples_to_global_batch_size = true;
  EXPECT_THAT(MegatronPretrainingSampler::Create(o),
              StatusIs(kInvalidArgument, HasSubstr("pad_samples_to_global_batch_size can be "
                                                   "true only when global_batch_size is set")));
}

TEST(MegatronSamplerValidationTest, SequentialRejectsRandomOnlyOptions) {
  PretrainingSamplerOptions o = Options(10, 2, 1);
  o.seed = 3;
  EXPECT_THAT(MegatronPretrainingSampler::Create(o),
              StatusIs(kInvalidArgument, HasSubstr("seed (3) must be 0")));
  o.seed = 0;
  o.random_permutation = RandomPermutation::kFeistel;
  EXPECT_THAT(MegatronPretrainingSampler::Create(o),
              StatusIs(kInvalidArgument, HasSubstr("random_permutation (\"feistel\")")));
}

TEST(MegatronSamplerValidationTest, RejectsOverflow) {
  PretrainingSamplerOptions o = Options(INT64_MAX - 1, 1, 1);
  o.global_batch_size = 8;
  EXPECT_THAT(MegatronPretrainingSampler::Create(o),
              StatusIs(kInvalidArgument, HasSubstr("overflows int64")));
  EXPECT_THAT(MegatronPretrainingSampler::Create(Options(10, INT64_MAX / 2, 3)),
              StatusIs(kInvalidArgument, HasSubstr("overflows int64")));
}

TEST(MegatronSamplerValidationTest, RandomRejectsPadding) {
  PretrainingSamplerOptions o = Options(16, 2, 2);
  o.global_batch_size = 8;
  o.pad_samples_to_global_batch_size = true;
  EXPECT_THAT(MegatronPretrainingRandomSampler::Create(o),
              StatusIs(kInvalidArgument, HasSubstr("does not support sample padding")));
}

TEST(MegatronSamplerValidationTest, RandomRejectsKeepLastUnlessGroupOfOne) {
  PretrainingSamplerOptions o = Options(16, 2, 1);
  o.drop_last = false;
  EXPECT_THAT(MegatronPretrainingRandomSampler::Create(o),
              StatusIs(kInvalidArgument, HasSubstr("drop_last = false needs micro_batch_size (2) x "
                                                   "data_parallel_size (1) = 1")));
  EXPECT_THAT(MegatronPretrainingRandomSampler::Create(Options(16, 1, 1)), IsOk());
  o = Options(16, 1, 1);
  o.drop_last = false;
  EXPECT_THAT(MegatronPretrainingRandomSampler::Create(o), IsOk());
}

TEST(MegatronSamplerValidationTest, RandomRejectsFewerSamplesThanOneGroup) {
  // The reference constructs it, then divides by zero in len() and iter().
  EXPECT_THAT(MegatronPretrainingRandomSampler::Create(Options(3, 2, 2)),
              StatusIs(kInvalidArgument, HasSubstr("total_samples (3) must be >= "
                                                   "micro_batch_size (2) x data_parallel_size "
                                                   "(2) = 4")));
}

// ---------------------------------------------------------------------------------------
// Spellings and the factory.

TEST(MegatronSamplerSpellingTest, ParsesExactlyTheReferenceSpellings) {
  DataloaderType type;
  std::string error;
  EXPECT_TRUE(AbslParseFlag("cyclic", &type, &error));
  EXPECT_EQ(type, DataloaderType::kCyclic);
  EXPECT_EQ(AbslUnparseFlag(DataloaderType::kSingle), "single");
  EXPECT_FALSE(AbslParseFlag("batch", &type, &error));
  EXPECT_EQ(error, "\"batch\" is not one of \"single\", \"cyclic\"");
  RandomPermutation permutation;
  EXPECT_TRUE(AbslParseFlag("feistel", &permutation, &error));
  EXPECT_EQ(permutation, RandomPermutation::kFeistel);
  EXPECT_EQ(AbslUnparseFlag(RandomPermutation::kRandperm), "randperm");
  EXPECT_FALSE(AbslParseFlag("Randperm", &permutation, &error));
}

TEST(CreateMegatronSamplerTest, SingleIsTheSequentialSampler) {
  MegatronSamplerOptions o;
  o.micro_batch_size = 2;
  o.global_batch_size = 8;
  KEEL_ASSERT_OK_AND_ASSIGN(auto sampler, CreateMegatronSampler(o, 25, /*rank=*/1, 2));
  auto* sequential = dynamic_cast<MegatronPretrainingSampler*>(sampler.get());
  ASSERT_THAT(sequential, NotNull());
  EXPECT_EQ(sequential->options().total_samples, 25);
  EXPECT_EQ(sequential->options().data_parallel_rank, 1);
  EXPECT_EQ(sequential->options().global_batch_size, 8);
  EXPECT_EQ(sampler->size(), 6);  // 25 // 8 global batches of 2 micro-batches per rank
}

TEST(CreateMegatronSamplerTest, SingleValidatesGlobalBatch) {
  MegatronSamplerOptions o;
  o.micro_batch_size = 2;
  o.global_batch_size = 6;
  EXPECT_THAT(CreateMegatronSampler(o, 25, 0, 2),
              StatusIs(kInvalidArgument, HasSubstr("global_batch_size (6)")));
  o.global_batch_size = 8;
  o.random_permutation = RandomPermutation::kFeistel;
  EXPECT_THAT(CreateMegatronSampler(o, 25, 0, 2),
              StatusIs(kInvalidArgument,
                       HasSubstr("random_permutation (\"feistel\") applies to dataloader_type "
                                 "\"cyclic\" only")));
  // The sequential sampler shuffles nothing: a shuffle scope is refused, not ignored.
  o.random_permutation = RandomPermutation::kRandperm;
  o.shuffle_scope = ShuffleScope::kGlobal;
  EXPECT_THAT(CreateMegatronSampler(o, 25, 0, 2),
              StatusIs(kInvalidArgument, HasSubstr("shuffle_scope (\"global\") applies to "
                                                   "dataloader_type \"cyclic\" only")));
}

TEST(CreateMegatronSamplerTest, CyclicIgnoresGlobalBatchPaddingAndSeed) {
  MegatronSamplerOptions o;
  o.micro_batch_size = 2;
  o.global_batch_size = 6;  // not divisible by 2 x 2, and ignored
  o.dataloader_type = DataloaderType::kCyclic;
  o.pad_samples_to_global_batch_size = true;  // ignored too
  KEEL_ASSERT_OK_AND_ASSIGN(auto sampler, CreateMegatronSampler(o, 25, /*rank=*/0, 2));
  auto* random = dynamic_cast<MegatronPretrainingRandomSampler*>(sampler.get());
  ASSERT_THAT(random, NotNull());
  EXPECT_EQ(random->options().global_batch_size, std::nullopt);
  EXPECT_FALSE(random->options().pad_samples_to_global_batch_size);
  EXPECT_EQ(random->options().seed, 0);
  EXPECT_EQ(random->options().random_permutation, RandomPermutation::kRandperm);
}

TEST(CreateMegatronSamplerTest, CyclicCarriesThePermutationMode) {
  MegatronSamplerOptions o;
  o.micro_batch_size = 1;
  o.dataloader_type = DataloaderType::kCyclic;
  o.random_permutation = RandomPermutation::kFeistel;
  KEEL_ASSERT_OK_AND_ASSIGN(auto sampler, CreateMegatronSampler(o, 25, 0, 1));
  EXPECT_EQ(sampler->options().random_permutation, RandomPermutation::kFeistel);
}

TEST(CreateMegatronSamplerTest, ReportsTheSamplersErrors) {
  MegatronSamplerOptions o;
  o.micro_batch_size = 1;
  o.global_batch_size = 1;
  EXPECT_THAT(CreateMegatronSampler(o, 10, /*rank=*/3, 3),
              StatusIs(kInvalidArgument, HasSubstr("data_parallel_rank (3)")));
  o.dataloader_type = DataloaderType::kCyclic;
  o.micro_batch_size = 2;
  o.drop_last = false;
  EXPECT_THAT(CreateMegatronSampler(o, 10, 0, 1),
              StatusIs(kInvalidArgument, HasSubstr("drop_last = false")));
}

// ---------------------------------------------------------------------------------------
// The sequential sampler.

TEST(MegatronPretrainingSamplerTest, SlicesEachGroupPerRank) {
  // Groups of 2 x 2: {0..3}, {4..7}, {8..11}; rank 1 takes the second half of each.
  auto sampler = Sequential(Options(12, 2, 2, /*rank=*/1));
  EXPECT_THAT(Pass(*sampler),
              ElementsAre(ElementsAre(2, 3), ElementsAre(6, 7), ElementsAre(10, 11)));
  EXPECT_EQ(sampler->size(), 3);
  EXPECT_EQ(sampler->NumMicroBatches(), 3);
}

TEST(MegatronPretrainingSamplerTest, DropLastDropsPartialGroupButLenCountsIt) {
  // 11 samples, groups of 4: two full groups; indices 8..10 are dropped. len is
  // (11 - 1) // 4 + 1 = 3 anyway.
  auto sampler = Sequential(Options(11, 2, 2, /*rank=*/0));
  EXPECT_THAT(Pass(*sampler), ElementsAre(ElementsAre(0, 1), ElementsAre(4, 5)));
  EXPECT_EQ(sampler->size(), 3);
  EXPECT_EQ(sampler->NumMicroBatches(), 2);
}

TEST(MegatronPretrainingSamplerTest, KeepLastSlicesPartialGroupDownToEmpty) {
  // 9 samples, groups of 4: the last group is {8}; rank 0 gets [8], rank 1 gets [].
  PretrainingSamplerOptions o = Options(9, 2, 2);
  o.drop_last = false;
  auto rank0 = Sequential(o);
  o.data_parallel_rank = 1;
  auto rank1 = Sequential(o);
  EXPECT_THAT(Pass(*rank0), ElementsAre(ElementsAre(0, 1), ElementsAre(4, 5), ElementsAre(8)));
  EXPECT_THAT(Pass(*rank1), ElementsAre(ElementsAre(2, 3), ElementsAre(6, 7), IsEmpty()));
  EXPECT_EQ(rank1->size(), 3);
  EXPECT_EQ(rank1->NumMicroBatches(), 3);
}

TEST(MegatronPretrainingSamplerTest, PadsLastGlobalBatchWithNegativeIndices) {
  // 10 samples, global batch 8: padded to 16 with -1..-6; groups of 4.
  PretrainingSamplerOptions o = Options(10, 2, 2, /*rank=*/1);
  o.drop_last = false;
  o.global_batch_size = 8;
  o.pad_samples_to_global_batch_size = true;
  auto sampler = Sequential(o);
  EXPECT_THAT(Pass(*sampler), ElementsAre(ElementsAre(2, 3), ElementsAre(6, 7), ElementsAre(-1, -2),
                                          ElementsAre(-5, -6)));
  EXPECT_EQ(sampler->size(), 4);  // ceil(10 / 8) = 2 global batches x 2 micro-batches
  EXPECT_EQ(sampler->NumMicroBatches(), 4);
}

TEST(MegatronPretrainingSamplerTest, PaddingNeedsKeepLast) {
  // With drop_last the padding flag is inert, as in the reference.
  PretrainingSamplerOptions o = Options(10, 2, 2);
  o.global_batch_size = 8;
  o.pad_samples_to_global_batch_size = true;
  auto sampler = Sequential(o);
  EXPECT_THAT(Pass(*sampler), ElementsAre(ElementsAre(0, 1), ElementsAre(4, 5)));
}

TEST(MegatronPretrainingSamplerTest, GlobalBatchLenCountsWholeGlobalBatches) {
  // 21 samples, groups of 4, global batch 8 (2 micro-batches per rank).
  PretrainingSamplerOptions o = Options(21, 2, 2);
  o.global_batch_size = 8;
  auto drop = Sequential(o);
  EXPECT_EQ(drop->size(), 4);             // 21 // 8 = 2 global batches
  EXPECT_EQ(drop->NumMicroBatches(), 5);  // 21 // 4 full groups are yielded
  EXPECT_THAT(Pass(*drop), SizeIs(5));
  o.drop_last = false;
  auto keep = Sequential(o);
  EXPECT_EQ(keep->size(), 6);             // ceil(21 / 8) = 3 global batches
  EXPECT_EQ(keep->NumMicroBatches(), 6);  // 5 full groups and {20}
  EXPECT_THAT(Pass(*keep), SizeIs(6));
}

TEST(MegatronPretrainingSamplerTest, FewerSamplesThanOneGroupYieldNothingWithDropLast) {
  auto sampler = Sequential(Options(3, 2, 2));
  EXPECT_THAT(Pass(*sampler), IsEmpty());
  EXPECT_EQ(sampler->size(), 1);  // (3 - 1) // 4 + 1
  EXPECT_EQ(sampler->NumMicroBatches(), 0);
  EXPECT_EQ(sampler->consumed_samples(), 0);
  EXPECT_THAT(sampler->LoadState({4, 0, 0}),
              StatusIs(kInvalidArgument, HasSubstr("consumed_samples (4) must be 0")));
}

TEST(MegatronPretrainingSamplerTest, RanksPartitionEachEpoch) {
  struct Case {
    int64_t total, mbs, dp;
    bool drop_last;
    std::optional<int64_t> gbs;
    bool pad;
  };
  for (const Case& c :
       {Case{23, 2, 3, true, std::nullopt, false}, Case{23, 2, 3, false, std::nullopt, false},
        Case{23, 2, 3, false, 12, true}, Case{100, 4, 5, true, 40, false},
        Case{7, 1, 7, false, std::nullopt, false}}) {
    SCOPED_TRACE(absl::StrCat("total=", c.total, " mbs=", c.mbs, " dp=", c.dp,
                              " drop_last=", c.drop_last, " pad=", c.pad));
    // Expected: whole groups only with drop_last; everything, then the padding -1, -2, ...
    // up to a whole number of global batches, without.
    const int64_t group = c.mbs * c.dp;
    std::vector<int64_t> expected;
    const int64_t kept = c.drop_last ? c.total / group * group : c.total;
    for (int64_t i = 0; i < kept; ++i) expected.push_back(i);
    if (c.pad) {
      for (int64_t i = 1; i <= (*c.gbs - c.total % *c.gbs) % *c.gbs; ++i) expected.push_back(-i);
    }
    std::vector<int64_t> seen;
    for (int64_t rank = 0; rank < c.dp; ++rank) {
      PretrainingSamplerOptions o = Options(c.total, c.mbs, c.dp, rank);
      o.drop_last = c.drop_last;
      o.global_batch_size = c.gbs;
      o.pad_samples_to_global_batch_size = c.pad;
      auto sampler = Sequential(o);
      ASSERT_NE(sampler, nullptr);
      const std::vector<int64_t> mine = Flatten(Pass(*sampler));
      seen.insert(seen.end(), mine.begin(), mine.end());
    }
    std::sort(seen.begin(), seen.end());
    std::sort(expected.begin(), expected.end());
    EXPECT_EQ(seen, expected);
  }
}

TEST(MegatronPretrainingSamplerTest, EveryPassIsTheSame) {
  auto sampler = Sequential(Options(10, 1, 2, /*rank=*/1));
  const Batches first = Pass(*sampler);
  EXPECT_EQ(Pass(*sampler), first);
  EXPECT_EQ(sampler->epoch(), 1);
  EXPECT_EQ(sampler->consumed_samples(), 20);
}

TEST(MegatronPretrainingSamplerTest, ResumesMidPass) {
  // Keel addition: consumed_samples positions the sequential sampler too.
  PretrainingSamplerOptions o = Options(23, 2, 3, /*rank=*/2);
  o.drop_last = false;
  auto reference = Sequential(o);
  Batches expected = Pass(*reference);
  const Batches second = Pass(*reference);
  expected.insert(expected.end(), second.begin(), second.end());
  for (int64_t cut = 0; cut <= 8; ++cut) {
    SCOPED_TRACE(absl::StrCat("cut after ", cut));
    auto first = Sequential(o);
    Batches got = Pass(*first, cut);
    const MegatronSamplerState state = first->State();
    auto resumed = Sequential(o);
    ASSERT_THAT(resumed->LoadState(state), IsOk());
    while (got.size() < expected.size()) {
      const Batches more = Pass(*resumed);
      got.insert(got.end(), more.begin(), more.end());
    }
    EXPECT_EQ(got, expected);
  }
}

TEST(MegatronPretrainingSamplerTest, StateRejectsSeedAndMisalignedPositions) {
  auto sampler = Sequential(Options(11, 2, 2));  // 8 samples per epoch with drop_last
  EXPECT_THAT(sampler->LoadState({0, 0, 5}), StatusIs(kInvalidArgument, HasSubstr("seed (5)")));
  EXPECT_THAT(sampler->LoadState({10, 1, 0}),
              StatusIs(kInvalidArgument, HasSubstr("consumed_samples (10)")));  // 10 % 8 = 2
  EXPECT_THAT(sampler->LoadState({12, 1, 0}), IsOk());
  EXPECT_THAT(Pass(*sampler), ElementsAre(ElementsAre(4, 5)));
}

// ---------------------------------------------------------------------------------------
// The random sampler.

TEST(MegatronPretrainingRandomSamplerTest, ShufflesEachBucketWithRandpermOfSeedPlusEpoch) {
  // 23 samples, groups of 2 x 2: active 20, buckets of 10; rank 1 owns 10..19.
  PretrainingSamplerOptions o = Options(23, 2, 2, /*rank=*/1);
  o.seed = 7;
  auto sampler = Random(o);
  EXPECT_EQ(sampler->bucket_size(), 10);
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    SCOPED_TRACE(epoch);
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(7 + epoch);
    const at::Tensor order = at::randperm(10, generator, at::kLong);
    std::vector<int64_t> expected;
    for (int64_t i = 0; i < 10; ++i) expected.push_back(10 + order[i].item<int64_t>());
    EXPECT_EQ(Flatten(Pass(*sampler)), expected);
    EXPECT_EQ(sampler->epoch(), epoch);
  }
}

TEST(MegatronPretrainingRandomSamplerTest, EpochIsSeededWithSeedPlusEpoch) {
  // NeMo's rule: epoch 1 with seed 4 is epoch 0 with seed 5 (Megatron-LM seeds with the epoch
  // alone).
  PretrainingSamplerOptions o = Options(40, 2, 2);
  o.seed = 4;
  auto a = Random(o);
  Pass(*a);
  o.seed = 5;
  auto b = Random(o);
  EXPECT_EQ(Pass(*a), Pass(*b));
}

TEST(MegatronPretrainingRandomSamplerTest, NegativeSeedIsTwosComplementAsInPython) {
  // torch.Generator().manual_seed(-1) takes the seed as uint64 2^64 - 1.
  PretrainingSamplerOptions o = Options(30, 1, 1);
  o.seed = -1;
  auto sampler = Random(o);
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(~uint64_t{0});
  const at::Tensor order = at::randperm(30, generator, at::kLong);
  const std::vector<int64_t> expected(order.data_ptr<int64_t>(), order.data_ptr<int64_t>() + 30);
  EXPECT_EQ(Flatten(Pass(*sampler)), expected);
}

struct Layout {
  int64_t total;
  int64_t mbs;
  int64_t dp;
};

// Over one epoch, the ranks' indices are exactly 0 .. active-1, each once: no overlap, no
// gap, nothing past the last whole group.
void ExpectRanksPartitionOneEpoch(const Layout& l, RandomPermutation permutation, int64_t seed) {
  const int64_t active = l.total / (l.mbs * l.dp) * (l.mbs * l.dp);
  std::vector<int64_t> seen;
  for (int64_t rank = 0; rank < l.dp; ++rank) {
    PretrainingSamplerOptions o = Options(l.total, l.mbs, l.dp, rank);
    o.seed = seed;
    o.random_permutation = permutation;
    auto sampler = Random(o);
    ASSERT_NE(sampler, nullptr);
    const int64_t count = sampler->NumMicroBatches();
    const Batches batches = Pass(*sampler);
    EXPECT_EQ(static_cast<int64_t>(batches.size()), count);
    for (const auto& batch : batches) EXPECT_THAT(batch, SizeIs(l.mbs));
    const std::vector<int64_t> mine = Flatten(batches);
    const int64_t bucket = active / l.dp;
    for (int64_t index : mine) {
      EXPECT_GE(index, rank * bucket);
      EXPECT_LT(index, (rank + 1) * bucket);
    }
    seen.insert(seen.end(), mine.begin(), mine.end());
    EXPECT_EQ(sampler->consumed_samples(), active);
  }
  std::sort(seen.begin(), seen.end());
  std::vector<int64_t> expected(active);
  for (int64_t i = 0; i < active; ++i) expected[i] = i;
  EXPECT_EQ(seen, expected);
}

TEST(MegatronPretrainingRandomSamplerTest, RanksPartitionEachEpoch) {
  for (const Layout& l : {Layout{10, 1, 1}, Layout{23, 2, 2}, Layout{113, 4, 3}, Layout{1000, 3, 5},
                          Layout{7, 1, 7}}) {
    for (RandomPermutation permutation :
         {RandomPermutation::kRandperm, RandomPermutation::kFeistel}) {
      SCOPED_TRACE(absl::StrCat("total=", l.total, " mbs=", l.mbs, " dp=", l.dp, " ",
                                AbslUnparseFlag(permutation)));
      ExpectRanksPartitionOneEpoch(l, permutation, /*seed=*/3);
    }
  }
}

TEST(MegatronPretrainingRandomSamplerTest, ReshufflesEveryEpoch) {
  for (RandomPermutation permutation :
       {RandomPermutation::kRandperm, RandomPermutation::kFeistel}) {
    SCOPED_TRACE(AbslUnparseFlag(permutation));
    PretrainingSamplerOptions o = Options(100, 1, 1);
    o.random_permutation = permutation;
    auto sampler = Random(o);
    const std::vector<int64_t> epoch0 = Flatten(Pass(*sampler));
    const std::vector<int64_t> epoch1 = Flatten(Pass(*sampler));
    EXPECT_NE(epoch0, epoch1);
    EXPECT_EQ(std::set<int64_t>(epoch0.begin(), epoch0.end()),
              std::set<int64_t>(epoch1.begin(), epoch1.end()));
  }
}

TEST(MegatronPretrainingRandomSamplerTest, FeistelIsNotMegatronsOrder) {
  PretrainingSamplerOptions o = Options(100, 1, 1);
  auto randperm = Random(o);
  o.random_permutation = RandomPermutation::kFeistel;
  auto feistel = Random(o);
  EXPECT_NE(Pass(*randperm), Pass(*feistel));
}

TEST(MegatronPretrainingRandomSamplerTest, LenQuirks) {
  // drop_last = false (allowed with groups of 1): len is one less than what a pass yields.
  PretrainingSamplerOptions o = Options(9, 1, 1);
  o.drop_last = false;
  auto keep = Random(o);
  EXPECT_EQ(keep->size(), 8);
  EXPECT_EQ(keep->NumMicroBatches(), 9);
  EXPECT_THAT(Pass(*keep), SizeIs(9));
  // With a global batch, whole global batches of what is left of the epoch: 50 samples,
  // groups of 4, active 48; after 12 consumed, 36 remain: 36 // 8 = 4 global batches x 2.
  o = Options(50, 2, 2);
  o.global_batch_size = 8;
  auto gbs = Random(o);
  EXPECT_EQ(gbs->size(), 12);  // 48 // 8 x 2
  Pass(*gbs, 3);
  EXPECT_EQ(gbs->size(), 8);
  EXPECT_EQ(gbs->NumMicroBatches(), 9);
  // Without a global batch and with drop_last: exactly the micro-batches left.
  auto plain = Random(Options(50, 2, 2));
  Pass(*plain, 5);
  EXPECT_EQ(plain->size(), 7);
  EXPECT_EQ(plain->NumMicroBatches(), 7);
}

TEST(MegatronPretrainingRandomSamplerTest, AbandonedPassIsContinuedByTheNext) {
  auto sampler = Random(Options(40, 2, 2, /*rank=*/1));
  const Batches whole = Pass(*Random(Options(40, 2, 2, /*rank=*/1)));
  Batches got = Pass(*sampler, 3);
  EXPECT_EQ(sampler->consumed_samples(), 12);
  const Batches rest = Pass(*sampler);
  got.insert(got.end(), rest.begin(), rest.end());
  EXPECT_EQ(got, whole);
  EXPECT_EQ(sampler->consumed_samples(), 40);
  EXPECT_EQ(sampler->epoch(), 0);
  Pass(*sampler, 1);
  EXPECT_EQ(sampler->epoch(), 1);
}

TEST(MegatronPretrainingRandomSamplerTest, NewPassEndsTheOldIterators) {
  auto sampler = Random(Options(40, 2, 2));
  auto old = sampler->begin();
  ASSERT_TRUE(old != sampler->end());
  auto current = sampler->begin();
  EXPECT_TRUE(old == sampler->end());
  ++old;  // harmless
  EXPECT_TRUE(current != sampler->end());
  EXPECT_EQ(sampler->consumed_samples(), 8);  // the first micro-batch of each pass
}

TEST(MegatronPretrainingRandomSamplerTest, SetEpochLeavesTheStreamAlone) {
  auto a = Random(Options(40, 2, 2));
  auto b = Random(Options(40, 2, 2));
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    b->SetEpoch(epoch + 5);
    EXPECT_EQ(Pass(*a), Pass(*b));
  }
}

TEST(MegatronPretrainingRandomSamplerTest, ResumesTheExactStream) {
  for (RandomPermutation permutation :
       {RandomPermutation::kRandperm, RandomPermutation::kFeistel}) {
    PretrainingSamplerOptions o = Options(47, 3, 3, /*rank=*/2);  // 5 groups of 9 per epoch
    o.seed = 11;
    o.random_permutation = permutation;
    // Three uninterrupted epochs.
    auto reference = Random(o);
    Batches expected;
    for (int i = 0; i < 3; ++i) {
      const Batches epoch = Pass(*reference);
      expected.insert(expected.end(), epoch.begin(), epoch.end());
    }
    for (int64_t cut = 0; cut <= 15; ++cut) {
      SCOPED_TRACE(absl::StrCat(AbslUnparseFlag(permutation), ": cut after ", cut));
      auto first = Random(o);
      Batches got;
      while (static_cast<int64_t>(got.size()) < cut) {
        const Batches more = Pass(*first, cut - static_cast<int64_t>(got.size()));
        got.insert(got.end(), more.begin(), more.end());
      }
      const MegatronSamplerState state = first->State();
      EXPECT_EQ(state.consumed_samples, cut * 9);
      EXPECT_EQ(state.seed, 11);
      PretrainingSamplerOptions fresh = o;
      fresh.seed = 0;  // the state's seed is adopted
      auto resumed = Random(fresh);
      ASSERT_THAT(resumed->LoadState(state), IsOk());
      EXPECT_EQ(resumed->State().epoch, state.epoch);
      while (got.size() < expected.size()) {
        const Batches more = Pass(*resumed);
        got.insert(got.end(), more.begin(), more.end());
      }
      EXPECT_EQ(got, expected);
    }
  }
}

TEST(MegatronPretrainingRandomSamplerTest, LoadStateRejectsBadStatesAndChangesNothing) {
  auto sampler = Random(Options(47, 3, 3));  // 45 samples per epoch, groups of 9
  Pass(*sampler, 2);
  const MegatronSamplerState before = sampler->State();
  EXPECT_THAT(sampler->LoadState({-9, 0, 0}),
              StatusIs(kInvalidArgument, HasSubstr("consumed_samples (-9) must be >= 0")));
  EXPECT_THAT(sampler->LoadState({9, -1, 0}),
              StatusIs(kInvalidArgument, HasSubstr("epoch (-1) must be >= 0")));
  EXPECT_THAT(sampler->LoadState({10, 0, 0}),
              StatusIs(kInvalidArgument, HasSubstr("consumed_samples (10)")));
  // 45 + 9: a group boundary of epoch 1, though not a multiple of 9 x 2.
  EXPECT_EQ(sampler->State().consumed_samples, before.consumed_samples);
  EXPECT_THAT(sampler->LoadState({54, 1, 0}), IsOk());
  EXPECT_EQ(sampler->NumMicroBatches(), 4);
}

TEST(MegatronPretrainingRandomSamplerTest, LoadStateEndsThePass) {
  auto sampler = Random(Options(40, 2, 2));
  auto it = sampler->begin();
  ASSERT_THAT(sampler->LoadState({0, 0, 0}), IsOk());
  EXPECT_TRUE(it == sampler->end());
}

TEST(MegatronPretrainingRandomSamplerTest, IsARange) {
  auto sampler = Random(Options(12, 1, 2, /*rank=*/1));
  int64_t count = 0;
  for (const std::vector<int64_t>& micro_batch : *sampler) {
    EXPECT_THAT(micro_batch, SizeIs(1));
    ++count;
  }
  EXPECT_EQ(count, 6);
}

// ---------------------------------------------------------------------------------------
// World-size changes mid-epoch.

// The micro-batches every rank of a `dp`-rank run yields for `global_batches` global batches
// of `g` samples, starting at `consumed` (as after a resume), and the consumed count after.
struct Served {
  std::vector<std::set<int64_t>> global_batches;  // the union over ranks, per global batch
  std::vector<int64_t> all;                       // every index served, in rank order
  int64_t consumed = 0;
};

Served RunFor(const MegatronSamplerOptions& options, int64_t total, int64_t dp, int64_t consumed,
              int64_t global_batches) {
  Served served;
  served.global_batches.resize(global_batches);
  const int64_t per_rank = options.global_batch_size / (options.micro_batch_size * dp);
  for (int64_t rank = 0; rank < dp; ++rank) {
    auto sampler = CreateMegatronSampler(options, total, rank, dp);
    EXPECT_THAT(sampler, IsOk());
    if (!sampler.ok()) return served;
    EXPECT_THAT((*sampler)->LoadState({consumed, 0, 0}), IsOk());
    auto it = (*sampler)->begin();
    for (int64_t b = 0; b < global_batches * per_rank; ++b) {
      if (b > 0) ++it;  // fetching a micro-batch consumes it
      EXPECT_NE(it, (*sampler)->end());
      for (int64_t index : *it) {
        served.global_batches[b / per_rank].insert(index);
        served.all.push_back(index);
      }
    }
    served.consumed = (*sampler)->consumed_samples();
  }
  return served;
}

MegatronSamplerOptions Cyclic(ShuffleScope scope) {
  MegatronSamplerOptions options;
  options.micro_batch_size = 2;
  options.global_batch_size = 12;
  options.dataloader_type = DataloaderType::kCyclic;
  options.shuffle_scope = scope;
  return options;
}

// 100 samples, global batches of 12: an epoch is 8 global batches, 96 samples. The run changes
// world size twice mid-epoch (2 ranks, then 3, then 1; all divide 12 / 2), and every sample of
// the epoch is served exactly once; each global batch holds the same samples as on one rank.
TEST(GlobalRandomSamplerTest, ServesEverySampleOfAnEpochOnceAcrossWorldSizeChanges) {
  for (RandomPermutation permutation :
       {RandomPermutation::kRandperm, RandomPermutation::kFeistel}) {
    SCOPED_TRACE(AbslUnparseFlag(permutation));
    MegatronSamplerOptions options = Cyclic(ShuffleScope::kGlobal);
    options.random_permutation = permutation;
    const Served one_rank = RunFor(options, 100, 1, 0, 8);
    Served two = RunFor(options, 100, 2, 0, 2);
    Served three = RunFor(options, 100, 3, two.consumed, 3);
    Served again_one = RunFor(options, 100, 1, three.consumed, 3);
    EXPECT_EQ(again_one.consumed, 96);
    std::vector<int64_t> epoch = two.all;
    epoch.insert(epoch.end(), three.all.begin(), three.all.end());
    epoch.insert(epoch.end(), again_one.all.begin(), again_one.all.end());
    ASSERT_EQ(epoch.size(), 96u);
    EXPECT_EQ(std::set<int64_t>(epoch.begin(), epoch.end()).size(), 96u);  // none twice
    std::vector<std::set<int64_t>> batches = two.global_batches;
    batches.insert(batches.end(), three.global_batches.begin(), three.global_batches.end());
    batches.insert(batches.end(), again_one.global_batches.begin(), again_one.global_batches.end());
    EXPECT_EQ(batches, one_rank.global_batches);
    // The next epoch is another order of the same kind.
    const Served next = RunFor(options, 100, 2, 96, 8);
    EXPECT_EQ(std::set<int64_t>(next.all.begin(), next.all.end()).size(), 96u);
    EXPECT_NE(next.global_batches, one_rank.global_batches);
  }
}

// Megatron's per-rank buckets, as documented on MegatronPretrainingRandomSampler: after a change
// from 2 to 3 ranks mid-epoch, the rest of the epoch comes from new buckets, so some samples
// come twice and others not at all; the next epoch is whole again.
TEST(MegatronPretrainingRandomSamplerTest, AWorldSizeChangeMidEpochRepeatsAndSkipsSamples) {
  const MegatronSamplerOptions options = Cyclic(ShuffleScope::kPerRank);
  // 96 samples: whole groups for 2 ranks (groups of 4) and 3 ranks (groups of 6) alike.
  Served two = RunFor(options, 96, 2, 0, 4);
  Served three = RunFor(options, 96, 3, two.consumed, 4);
  EXPECT_EQ(three.consumed, 96);
  std::vector<int64_t> epoch = two.all;
  epoch.insert(epoch.end(), three.all.begin(), three.all.end());
  ASSERT_EQ(epoch.size(), 96u);
  const std::set<int64_t> distinct(epoch.begin(), epoch.end());
  EXPECT_LT(distinct.size(), 96u);  // repeats, hence omissions too
  const Served next = RunFor(options, 96, 3, 96, 8);
  EXPECT_EQ(std::set<int64_t>(next.all.begin(), next.all.end()).size(), 96u);
}

TEST(GlobalRandomSamplerTest, NeedsWholeGlobalBatches) {
  MegatronSamplerOptions options = Cyclic(ShuffleScope::kGlobal);
  options.global_batch_size = 0;
  EXPECT_THAT(CreateMegatronSampler(options, 100, 0, 1),
              StatusIs(kInvalidArgument, HasSubstr("global_batch_size (0) must be > 0")));
  options.global_batch_size = 12;
  EXPECT_THAT(CreateMegatronSampler(options, 10, 0, 1),
              StatusIs(kInvalidArgument,
                       HasSubstr("total_samples (10) must be >= global_batch_size (12)")));
  PretrainingSamplerOptions bare = Options(100, 2, 1);
  EXPECT_THAT(GlobalRandomSampler::Create(bare),
              StatusIs(kInvalidArgument, HasSubstr("needs global_batch_size")));
}

}  // namespace
}  // namespace keel::sampling
