#include "sampling/internal/md5.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "absl/strings/escaping.h"

namespace keel::sampling::internal {
namespace {

// Per-round left rotations, four per group of 16 steps.
constexpr int kShifts[4][4] = {{7, 12, 17, 22}, {5, 9, 14, 20}, {4, 11, 16, 23}, {6, 10, 15, 21}};

uint32_t RotateLeft(uint32_t x, int c) { return (x << c) | (x >> (32 - c)); }

// The sine table: floor(|sin(i + 1)| * 2^32), exact in double precision.
struct SineTable {
  uint32_t k[64];
  SineTable() {
    for (int i = 0; i < 64; ++i) {
      k[i] = static_cast<uint32_t>(std::floor(std::fabs(std::sin(i + 1.0)) * 4294967296.0));
    }
  }
};

void ProcessBlock(const uint8_t* block, const SineTable& table, uint32_t state[4]) {
  uint32_t m[16];
  for (int i = 0; i < 16; ++i) {
    m[i] = uint32_t{block[4 * i]} | uint32_t{block[4 * i + 1]} << 8 |
           uint32_t{block[4 * i + 2]} << 16 | uint32_t{block[4 * i + 3]} << 24;
  }
  uint32_t a = state[0], b = state[1], c = state[2], d = state[3];
  for (int i = 0; i < 64; ++i) {
    uint32_t f;
    int g;
    switch (i / 16) {
      case 0:
        f = (b & c) | (~b & d);
        g = i;
        break;
      case 1:
        f = (d & b) | (~d & c);
        g = (5 * i + 1) % 16;
        break;
      case 2:
        f = b ^ c ^ d;
        g = (3 * i + 5) % 16;
        break;
      default:
        f = c ^ (b | ~d);
        g = (7 * i) % 16;
        break;
    }
    f += a + table.k[i] + m[g];
    a = d;
    d = c;
    c = b;
    b += RotateLeft(f, kShifts[i / 16][i % 4]);
  }
  state[0] += a;
  state[1] += b;
  state[2] += c;
  state[3] += d;
}

}  // namespace

std::string Md5Hex(absl::string_view data) {
  static const SineTable table;
  uint32_t state[4] = {0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476};
  size_t offset = 0;
  for (; offset + 64 <= data.size(); offset += 64) {
    ProcessBlock(reinterpret_cast<const uint8_t*>(data.data()) + offset, table, state);
  }
  // The tail, 0x80, zeros up to 56 mod 64, and the message length in bits, little-endian.
  uint8_t tail[128] = {};
  const size_t rest = data.size() - offset;
  std::memcpy(tail, data.data() + offset, rest);
  tail[rest] = 0x80;
  const size_t tail_size = rest < 56 ? 64 : 128;
  const uint64_t bits = static_cast<uint64_t>(data.size()) * 8;
  for (int i = 0; i < 8; ++i) tail[tail_size - 8 + i] = static_cast<uint8_t>(bits >> (8 * i));
  for (size_t block = 0; block < tail_size; block += 64) ProcessBlock(tail + block, table, state);
  std::string digest(16, '\0');
  for (int i = 0; i < 16; ++i) digest[i] = static_cast<char>(state[i / 4] >> (8 * (i % 4)));
  return absl::BytesToHexString(digest);
}

}  // namespace keel::sampling::internal
