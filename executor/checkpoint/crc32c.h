// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78, as iSCSI/ext4) for checkpoint checksums: the SSE4.2
// crc32 instruction where the CPU has it, a slicing-by-8 table otherwise (same values).
#pragma once
#include <cstddef>
#include <cstdint>

namespace megatune::executor::checkpoint {

// Continues a CRC: crc32c_update(crc32c_update(0, a), b) == CRC of a followed by b.
// crc32c_update(0, "123456789", 9) == 0xE3069283.
uint32_t crc32c_update(uint32_t crc, const void* data, size_t size_bytes);
// The portable table implementation (what crc32c_update falls back to); exposed for tests.
uint32_t crc32c_update_portable(uint32_t crc, const void* data, size_t size_bytes);

}  // namespace megatune::executor::checkpoint
