#include "sampling/numpy_random.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace keel::sampling {

absl::StatusOr<NumpyRandomState> NumpyRandomState::Create(int64_t seed) {
  if (seed < 0 || seed > int64_t{0xffffffff}) {
    return absl::InvalidArgumentError(
        absl::StrCat("random seed ", seed, " is outside numpy's [0, 2^32 - 1]"));
  }
  return NumpyRandomState(static_cast<uint32_t>(seed));
}

uint64_t NumpyRandomState::NextUint64() {
  const uint64_t high = NextUint32();
  return (high << 32) | NextUint32();
}

double NumpyRandomState::RandomSample() {
  const int64_t a = NextUint32() >> 5;
  const int64_t b = NextUint32() >> 6;
  return (static_cast<double>(a) * 67108864.0 + static_cast<double>(b)) / 9007199254740992.0;
}

uint64_t NumpyRandomState::RandomInterval(uint64_t max) {
  if (max == 0) return 0;
  uint64_t mask = max;
  for (int shift = 1; shift <= 32; shift *= 2) mask |= mask >> shift;
  uint64_t value;
  if (max <= 0xffffffffu) {
    do {
      value = NextUint32() & mask;
    } while (value > max);
  } else {
    do {
      value = NextUint64() & mask;
    } while (value > max);
  }
  return value;
}

}  // namespace keel::sampling
