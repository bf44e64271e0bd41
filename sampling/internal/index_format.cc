#include "sampling/internal/index_format.h"

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/quote.h"

namespace keel::sampling::internal {
namespace {

absl::Status Corrupt(const std::string& message) { return absl::DataLossError(message); }

template <typename T>
void Append(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

}  // namespace

int64_t ItemSizeOfCode(uint8_t code) {
  switch (code) {
    case 1:  // uint8
    case 2:  // int8
      return 1;
    case 3:  // int16
    case 8:  // uint16
      return 2;
    case 4:  // int32
    case 7:  // float32
      return 4;
    case 5:  // int64
    case 6:  // float64
      return 8;
    default:
      return 0;
  }
}

absl::StatusOr<IndexLayout> ParseIndex(absl::Span<const uint8_t> index, uint64_t bin_size,
                                       bool multimodal) {
  const uint64_t size = index.size();
  if (size < static_cast<uint64_t>(kIndexHeaderSize)) {
    return Corrupt(absl::StrCat("index is ", size, " bytes, shorter than its ", kIndexHeaderSize,
                                "-byte header"));
  }
  const uint8_t* p = index.data();
  if (std::memcmp(p, kIndexMagic, sizeof(kIndexMagic)) != 0) {
    return Corrupt(absl::StrCat(
        "bad magic \"", base::Printable(absl::string_view(reinterpret_cast<const char*>(p), 9)),
        "\": expected \"MMIDIDX\\x00\\x00\""));
  }
  const uint64_t version = Load<uint64_t>(p + 9);
  if (version != 1) {
    return Corrupt(absl::StrCat("unknown version ", version, ": only 1 exists"));
  }
  IndexLayout layout;
  layout.dtype_code = p[17];
  layout.item_size = ItemSizeOfCode(layout.dtype_code);
  if (layout.item_size == 0) {
    return Corrupt(absl::StrCat("unknown dtype code ", layout.dtype_code,
                                ": expected 1 (uint8), 2 (int8), 3 (int16), 4 (int32), "
                                "5 (int64), 6 (float64), 7 (float32) or 8 (uint16)"));
  }
  const uint64_t n = Load<uint64_t>(p + 18);
  const uint64_t d = Load<uint64_t>(p + 26);
  // 128-bit arithmetic: n and d come from the file and may be anything.
  const unsigned __int128 per_sequence = multimodal ? 13 : 12;
  const unsigned __int128 expected =
      kIndexHeaderSize + per_sequence * n + static_cast<unsigned __int128>(8) * d;
  if (expected != size) {
    std::string hint;
    const unsigned __int128 other = expected + (multimodal ? -static_cast<unsigned __int128>(n)
                                                           : static_cast<unsigned __int128>(n));
    if (other == size) {
      hint = multimodal ? "; it would fit a dataset that is not multimodal"
                        : "; it would fit a multimodal dataset (sequence modes)";
    }
    const auto shown = [](unsigned __int128 v) {
      return v > UINT64_MAX ? std::string("more than 2^64")
                            : absl::StrCat(static_cast<uint64_t>(v));
    };
    return Corrupt(absl::StrCat("index is ", size, " bytes but its header (", n, " sequences, ", d,
                                " document indices", multimodal ? ", multimodal" : "", ") needs ",
                                shown(expected), hint));
  }
  layout.sequence_count = static_cast<int64_t>(n);
  layout.document_count = static_cast<int64_t>(d);
  layout.lengths = p + kIndexHeaderSize;
  layout.pointers = layout.lengths + 4 * n;
  layout.documents = layout.pointers + 8 * n;
  layout.modes = multimodal ? layout.documents + 8 * d : nullptr;

  if (d == 0) {
    return Corrupt("document_indices is empty: it must start at 0 and end at the sequence count");
  }
  int64_t previous = 0;
  for (uint64_t j = 0; j < d; ++j) {
    const int64_t document = Load<int64_t>(layout.documents + 8 * j);
    if (j == 0 ? document != 0 : document < previous) {
      return Corrupt(absl::StrCat(
          "document_indices[", j, "] is ", document,
          j == 0 ? ": must be 0" : absl::StrCat(": must be >= the one before (", previous, ")")));
    }
    previous = document;
  }
  if (previous != layout.sequence_count) {
    return Corrupt(absl::StrCat("document_indices ends at ", previous,
                                ": must end at the sequence count (", n, ")"));
  }

  int64_t end = 0;  // where the previous sequence ends in .bin
  for (uint64_t i = 0; i < n; ++i) {
    const int32_t length = Load<int32_t>(layout.lengths + 4 * i);
    const int64_t pointer = Load<int64_t>(layout.pointers + 8 * i);
    if (length < 0) {
      return Corrupt(absl::StrCat("sequence_lengths[", i, "] is ", length, ": must be >= 0"));
    }
    if (pointer < end) {
      return Corrupt(absl::StrCat("sequence_pointers[", i, "] is ", pointer,
                                  ": must be >= the end of the sequence before (", end, ")"));
    }
    if (pointer % layout.item_size != 0) {
      return Corrupt(absl::StrCat("sequence_pointers[", i, "] is ", pointer,
                                  ": must be a multiple of the item size (", layout.item_size,
                                  ")"));
    }
    const uint64_t bytes = static_cast<uint64_t>(length) * layout.item_size;
    if (static_cast<uint64_t>(pointer) > bin_size || bytes > bin_size - pointer ||
        bytes > static_cast<uint64_t>(INT64_MAX - pointer)) {
      return Corrupt(absl::StrCat("sequence ", i, " (", length, " tokens at byte ", pointer,
                                  ") ends past the end of the .bin (", bin_size, " bytes)"));
    }
    if (pointer != end) layout.contiguous = false;
    end = pointer + static_cast<int64_t>(bytes);
    layout.num_tokens += length;
  }
  return layout;
}

std::string SerializeIndex(uint8_t dtype_code, absl::Span<const int32_t> lengths,
                           absl::Span<const int64_t> pointers,
                           absl::Span<const int64_t> document_indices,
                           absl::Span<const int8_t> modes) {
  std::string out(kIndexMagic, sizeof(kIndexMagic));
  Append<uint64_t>(out, 1);
  Append<uint8_t>(out, dtype_code);
  Append<uint64_t>(out, lengths.size());
  Append<uint64_t>(out, document_indices.size());
  for (const int32_t length : lengths) Append(out, length);
  for (const int64_t pointer : pointers) Append(out, pointer);
  for (const int64_t document : document_indices) Append(out, document);
  for (const int8_t mode : modes) Append(out, mode);
  return out;
}

}  // namespace keel::sampling::internal
