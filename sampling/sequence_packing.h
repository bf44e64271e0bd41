// Samples packed into sequences of a fixed length, as NeMo AutoModel packs them with its
// default "thd" strategy (nemo_automodel/components/datasets/llm/packed_sequence.py
// pack_dataset): in order, each sample goes whole into the current pack when it fits, else it
// closes the pack and starts the next; a sample longer than a pack is dropped. It knows only
// lengths: what a sample is, and how a pack's tokens are laid out, are its users'.
//
//   const keel::sampling::Packs packs = keel::sampling::PackInOrder({3, 4, 2, 9}, 6);
//   // packs.packs == {{0}, {1, 2}}: 3 + 4 > 6 closes the first; packs.dropped == {3}.
#ifndef KEEL_SAMPLING_SEQUENCE_PACKING_H_
#define KEEL_SAMPLING_SEQUENCE_PACKING_H_

#include <cstdint>
#include <vector>

#include "base/fields.h"

namespace keel::sampling {

// NeMo AutoModel's packed_sequence section (the "thd" strategy, without max_packs).
struct PackedSequenceOptions {
  // Tokens in each pack; 0: no packing. Default: 0.
  int64_t packed_sequence_size = 0;
};

template <typename O, typename V, base::IsFieldsOf<O, PackedSequenceOptions> = 0>
void VisitFields(O& o, V&& v) {
  v("packed_sequence_size", o.packed_sequence_size);
}

struct Packs {
  // Each pack's samples (their positions in the lengths packed), in order; their lengths sum
  // to at most the pack size.
  std::vector<std::vector<int64_t>> packs;
  // The samples longer than a pack, in order.
  std::vector<int64_t> dropped;
};

// `lengths` packed in order into packs of `size`. Requires: size > 0; lengths >= 0.
Packs PackInOrder(const std::vector<int64_t>& lengths, int64_t size);

}  // namespace keel::sampling

#endif  // KEEL_SAMPLING_SEQUENCE_PACKING_H_
