// numpy's legacy random generator, draw for draw: numpy.random.RandomState(seed) for an
// integer seed (numpy/random/mtrand.pyx: MT19937 seeded by init_genrand, as
// MT19937._legacy_seeding does for an int), random_sample(), and the legacy shuffle of a 1-D
// array (RandomState.shuffle: Fisher-Yates from the end, each index drawn by
// random_interval's masked rejection sampling). Megatron-Core shuffles its GPT dataset
// indices with it (megatron/core/datasets/gpt_dataset.py, numpy.random.RandomState).
//
//   KEEL_ASSIGN_OR_RETURN(auto rng, keel::sampling::NumpyRandomState::Create(1234));
//   std::vector<int32_t> order = {0, 1, 2, 3};
//   rng.Shuffle(order.data(), order.size());  // as RandomState(1234).shuffle(order)
#ifndef KEEL_SAMPLING_NUMPY_RANDOM_H_
#define KEEL_SAMPLING_NUMPY_RANDOM_H_

#include <cstdint>
#include <random>
#include <utility>

#include "absl/status/statusor.h"

namespace keel::sampling {

class NumpyRandomState {
 public:
  // RandomState(seed). Errors: kInvalidArgument unless 0 <= seed <= 2^32 - 1 (numpy's
  // ValueError "Seed must be between 0 and 2**32 - 1").
  [[nodiscard]] static absl::StatusOr<NumpyRandomState> Create(int64_t seed);

  // The next 32 bits of the Mersenne Twister.
  uint32_t NextUint32() { return static_cast<uint32_t>(mt_()); }
  // Two draws, the first one the high word (numpy's mt19937_next64).
  uint64_t NextUint64();
  // random_sample(): a double in [0, 1) from 53 bits of two draws.
  double RandomSample();
  // random_interval(max): uniform in [0, max], drawing under the smallest all-ones mask >= max
  // and rejecting values above max (32-bit draws when max < 2^32, else 64-bit ones).
  uint64_t RandomInterval(uint64_t max);

  // RandomState.shuffle of a 1-D array of `n` elements, in place.
  template <typename T>
  void Shuffle(T* data, int64_t n) {
    for (int64_t i = n - 1; i > 0; --i) {
      const int64_t j = static_cast<int64_t>(RandomInterval(static_cast<uint64_t>(i)));
      std::swap(data[i], data[j]);
    }
  }

 private:
  explicit NumpyRandomState(uint32_t seed) : mt_(seed) {}

  // std::mt19937's seeding is init_genrand's and its output MT19937's.
  std::mt19937 mt_;
};

}  // namespace keel::sampling

#endif  // KEEL_SAMPLING_NUMPY_RANDOM_H_
