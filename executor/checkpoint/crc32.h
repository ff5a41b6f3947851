// CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320, as zlib's crc32) for checkpoint checksums.
#pragma once
#include <cstddef>
#include <cstdint>

namespace megatune::executor::checkpoint {

// Continues a CRC: crc32_update(crc32_update(0, a), b) == CRC of a followed by b. crc32_update(0,
// "123456789") is 0xCBF43926.
uint32_t crc32_update(uint32_t crc, const void* data, size_t size_bytes);

}  // namespace megatune::executor::checkpoint
