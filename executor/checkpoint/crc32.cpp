// CRC-32 (IEEE, reflected 0xEDB88320) with a slicing-by-8 table for checkpoint tensor checksums.
#include "executor/checkpoint/crc32.h"

#include <array>
#include <cstring>

namespace megatune::executor::checkpoint {

namespace {

using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables make_tables() {
  Tables tables{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1U) ? 0xEDB88320U : 0U);
    tables[0][i] = crc;
  }
  for (uint32_t i = 0; i < 256; ++i) {
    for (size_t t = 1; t < 8; ++t)
      tables[t][i] = (tables[t - 1][i] >> 8) ^ tables[0][tables[t - 1][i] & 0xFFU];
  }
  return tables;
}

constexpr Tables kTables = make_tables();

}  // namespace

uint32_t crc32_update(uint32_t crc, const void* data, size_t size_bytes) {
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

}  // namespace megatune::executor::checkpoint
