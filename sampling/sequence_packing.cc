#include "sampling/sequence_packing.h"

#include <utility>

#include "c10/util/Exception.h"

namespace keel::sampling {

Packs PackInOrder(const std::vector<int64_t>& lengths, int64_t size) {
  TORCH_INTERNAL_ASSERT(size > 0, "PackInOrder: pack size ", size);
  Packs result;
  std::vector<int64_t> pack;
  int64_t used = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(lengths.size()); ++i) {
    const int64_t length = lengths[i];
    TORCH_INTERNAL_ASSERT(length >= 0, "PackInOrder: sample ", i, " has length ", length);
    if (length > size) {
      result.dropped.push_back(i);
      continue;
    }
    if (used + length > size) {
      result.packs.push_back(std::move(pack));
      pack.clear();
      used = 0;
    }
    pack.push_back(i);
    used += length;
  }
  if (!pack.empty()) result.packs.push_back(std::move(pack));
  return result;
}

}  // namespace keel::sampling
