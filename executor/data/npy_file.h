// NumPy .npy (format 1.0) writer for index arrays, so GPTDataset's indices can be compared with the
// document/sample/shuffle index .npy files Megatron-LM caches next to a dataset.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "executor/data/gpt_dataset_indices.h"

namespace megatune::executor::data {

enum class NpyDType { int32, int64, uint32 };

// The .npy bytes of a C-order array: magic, version 1.0, the header dict padded with spaces to a multiple
// of 64 bytes (ending in '\n'), then the little-endian data of product(shape) elements.
std::vector<unsigned char> npy_bytes(NpyDType dtype, std::span<const int64_t> shape, const void* data);
// Writes npy_bytes to path. Throws UserError if the file cannot be written.
void write_npy(const std::string& path, NpyDType dtype, std::span<const int64_t> shape, const void* data);

// Writes {prefix}-document_index.npy (int32), {prefix}-sample_index.npy ((n+1, 2), int32 when every value
// fits, as helpers.cpp, else int64) and {prefix}-shuffle_index.npy (uint32, int64 from 2^32 - 1 samples).
// Compare with Megatron's cache files with numpy.array_equal.
void write_gpt_dataset_indices(const std::string& prefix, const GPTDatasetIndices& indices);

}  // namespace megatune::executor::data
