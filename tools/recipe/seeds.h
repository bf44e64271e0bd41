// Seeds for the default generator derived from the run's seed, so that a stream of draws
// depends on nothing drawn before it (the layout, a resume).
//
//   torch::manual_seed(DerivedSeed(options.seed, {rank, step}));
#ifndef KEEL_TOOLS_RECIPE_SEEDS_H_
#define KEEL_TOOLS_RECIPE_SEEDS_H_

#include <cstdint>
#include <initializer_list>

namespace keel::tools::recipe {

// `seed` and `parts` mixed by splitmix64's finalizer, part after part: distinct, well-mixed
// seeds for distinct inputs.
inline uint64_t DerivedSeed(int64_t seed, std::initializer_list<int64_t> parts) {
  uint64_t z = static_cast<uint64_t>(seed);
  for (const int64_t part : parts) {
    z += 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(part);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
  }
  return z;
}

}  // namespace keel::tools::recipe

#endif  // KEEL_TOOLS_RECIPE_SEEDS_H_
