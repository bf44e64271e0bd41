// Token bytes of a .bin widened to int64, whatever the integer dtype.
#ifndef KEEL_SAMPLING_INTERNAL_TOKENS_H_
#define KEEL_SAMPLING_INTERNAL_TOKENS_H_

#include <cstdint>
#include <cstring>

#include "c10/util/Exception.h"
#include "sampling/indexed_dataset_writer.h"

namespace keel::sampling::internal {

// Tokens in the .bin are aligned to their size (IndexedDataset checks the pointers), but
// memcpy keeps this free of aliasing assumptions; it compiles to plain loads.
template <typename T>
void Widen(const uint8_t* in, int64_t count, int64_t* out) {
  for (int64_t i = 0; i < count; ++i) {
    T token;
    std::memcpy(&token, in + i * sizeof(T), sizeof(T));
    out[i] = static_cast<int64_t>(token);
  }
}

// Converts `count` integer tokens of `dtype` at `in` to int64. Requires: an integer dtype.
inline void WidenTokens(TokenDtype dtype, const uint8_t* in, int64_t count, int64_t* out) {
  switch (dtype) {
    case TokenDtype::kUint8:
      return Widen<uint8_t>(in, count, out);
    case TokenDtype::kInt8:
      return Widen<int8_t>(in, count, out);
    case TokenDtype::kInt16:
      return Widen<int16_t>(in, count, out);
    case TokenDtype::kInt32:
      return Widen<int32_t>(in, count, out);
    case TokenDtype::kInt64:
      return Widen<int64_t>(in, count, out);
    case TokenDtype::kUint16:
      return Widen<uint16_t>(in, count, out);
    case TokenDtype::kFloat64:
    case TokenDtype::kFloat32:
      TORCH_INTERNAL_ASSERT(false, "GPT datasets refuse floating-point tokens");
  }
}

}  // namespace keel::sampling::internal

#endif  // KEEL_SAMPLING_INTERNAL_TOKENS_H_
