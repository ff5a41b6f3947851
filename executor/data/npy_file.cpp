// NumPy .npy writer and the dump of GPTDataset indices in Megatron's cache layout.
#include "executor/data/npy_file.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include "base/output_file.h"
#include "base/user_error.h"

namespace megatune::executor::data {

std::vector<unsigned char> npy_bytes(NpyDType dtype, std::span<const int64_t> shape, const void* data) {
  const char* descr = dtype == NpyDType::int32 ? "<i4" : dtype == NpyDType::int64 ? "<i8" : "<u4";
  const size_t item_bytes = dtype == NpyDType::int64 ? 8 : 4;
  std::string shape_text = "(";
  int64_t elements = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (d > 0) shape_text += ", ";
    shape_text += std::to_string(shape[d]);
    elements *= shape[d];
  }
  if (shape.size() == 1) shape_text.push_back(',');
  shape_text.push_back(')');
  std::string header = "{'descr': '";
  header += descr;
  header += "', 'fortran_order': False, 'shape': ";
  header += shape_text;
  header += ", }";
  const size_t preamble_bytes = 10;  // magic (6) + version (2) + header length (2)
  const size_t padded = (preamble_bytes + header.size() + 1 + 63) / 64 * 64;
  header.append(padded - preamble_bytes - header.size() - 1, ' ');
  header.push_back('\n');
  std::vector<unsigned char> bytes{0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  const auto header_length = static_cast<uint16_t>(header.size());
  bytes.push_back(static_cast<unsigned char>(header_length & 0xFF));
  bytes.push_back(static_cast<unsigned char>(header_length >> 8));
  bytes.insert(bytes.end(), header.begin(), header.end());
  const auto* raw = static_cast<const unsigned char*>(data);
  if (elements > 0) bytes.insert(bytes.end(), raw, raw + static_cast<size_t>(elements) * item_bytes);
  return bytes;
}

void write_npy(const std::string& path, NpyDType dtype, std::span<const int64_t> shape, const void* data) {
  const auto bytes = npy_bytes(dtype, shape, data);
  // Temporary file + rename: a failed write leaves a previous file of that name intact.
  write_output_file(path, std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()), "npy file");
}

void write_gpt_dataset_indices(const std::string& prefix, const GPTDatasetIndices& indices) {
  const std::vector<int64_t> document_shape{static_cast<int64_t>(indices.document_index.size())};
  write_npy(prefix + "-document_index.npy", NpyDType::int32, document_shape, indices.document_index.data());

  const std::vector<int64_t> sample_shape{static_cast<int64_t>(indices.sample_index.size() / 2), 2};
  bool fits_int32 = true;
  for (const int64_t value : indices.sample_index)
    fits_int32 = fits_int32 && value <= std::numeric_limits<int32_t>::max();
  if (fits_int32) {
    const std::vector<int32_t> narrow(indices.sample_index.begin(), indices.sample_index.end());
    write_npy(prefix + "-sample_index.npy", NpyDType::int32, sample_shape, narrow.data());
  } else {
    write_npy(prefix + "-sample_index.npy", NpyDType::int64, sample_shape, indices.sample_index.data());
  }

  const std::vector<int64_t> shuffle_shape{indices.num_samples()};
  if (indices.num_samples() >= static_cast<int64_t>(std::numeric_limits<uint32_t>::max()) - 1) {
    write_npy(prefix + "-shuffle_index.npy", NpyDType::int64, shuffle_shape, indices.shuffle_index.data());
  } else {
    const std::vector<uint32_t> narrow(indices.shuffle_index.begin(), indices.shuffle_index.end());
    write_npy(prefix + "-shuffle_index.npy", NpyDType::uint32, shuffle_shape, narrow.data());
  }
}

}  // namespace megatune::executor::data
