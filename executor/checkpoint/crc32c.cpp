// CRC-32C: hardware (SSE4.2) path and slicing-by-8 table path.
#include "executor/checkpoint/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define MEGATUNE_CRC32C_X86 1
#endif

namespace megatune::executor::checkpoint {

namespace {

using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables make_tables() {
  Tables tables{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1U) ? 0x82F63B78U : 0U);
    tables[0][i] = crc;
  }
  for (uint32_t i = 0; i < 256; ++i) {
    for (size_t t = 1; t < 8; ++t)
      tables[t][i] = (tables[t - 1][i] >> 8) ^ tables[0][tables[t - 1][i] & 0xFFU];
  }
  return tables;
}

constexpr Tables kTables = make_tables();

#ifdef MEGATUNE_CRC32C_X86
__attribute__((target("sse4.2"))) uint32_t crc32c_hardware(uint32_t crc, const unsigned char* bytes,
                                                           size_t size) {
  uint64_t state = ~crc;
  while (size >= 8) {
    uint64_t word;
    std::memcpy(&word, bytes, 8);
    state = _mm_crc32_u64(state, word);
    bytes += 8;
    size -= 8;
  }
  auto state32 = static_cast<uint32_t>(state);
  while (size-- > 0) state32 = _mm_crc32_u8(state32, *bytes++);
  return ~state32;
}

bool cpu_has_sse42() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#endif

}  // namespace

uint32_t crc32c_update_portable(uint32_t crc, const void* data, size_t size_bytes) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  crc = ~crc;
  while (size_bytes >= 8) {
    uint32_t low, high;
    std::memcpy(&low, bytes, 4);
    std::memcpy(&high, bytes + 4, 4);
    low ^= crc;
    crc = kTables[7][low & 0xFF] ^ kTables[6][(low >> 8) & 0xFF] ^ kTables[5][(low >> 16) & 0xFF] ^
          kTables[4][low >> 24] ^ kTables[3][high & 0xFF] ^ kTables[2][(high >> 8) & 0xFF] ^
          kTables[1][(high >> 16) & 0xFF] ^ kTables[0][high >> 24];
    bytes += 8;
    size_bytes -= 8;
  }
  while (size_bytes-- > 0) crc = (crc >> 8) ^ kTables[0][(crc ^ *bytes++) & 0xFF];
  return ~crc;
}

uint32_t crc32c_update(uint32_t crc, const void* data, size_t size_bytes) {
#ifdef MEGATUNE_CRC32C_X86
  if (cpu_has_sse42()) return crc32c_hardware(crc, static_cast<const unsigned char*>(data), size_bytes);
#endif
  return crc32c_update_portable(crc, data, size_bytes);
}

}  // namespace megatune::executor::checkpoint
