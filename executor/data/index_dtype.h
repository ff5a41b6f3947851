// Token dtypes of Megatron's indexed dataset (.idx dtype codes, megatron.md §7) and their sizes.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace megatune::executor::data {

// The numeric code stored at byte 17 of an .idx file (numpy dtype of the .bin tokens).
enum class IndexDType : uint8_t {
  uint8 = 1,
  int8 = 2,
  int16 = 3,
  int32 = 4,
  int64 = 5,
  float64 = 6,
  float32 = 7,
  uint16 = 8,
};

// The dtype for a code read from a file; nullopt for a code Megatron does not define.
std::optional<IndexDType> index_dtype_from_code(uint8_t code);
int64_t index_dtype_size_bytes(IndexDType dtype);
std::string index_dtype_name(IndexDType dtype);  // numpy spelling: "uint16", "int32", ...
bool index_dtype_is_integer(IndexDType dtype);
// The dtype Megatron's preprocess_data.py picks: uint16 if vocab_size < 65500 else int32.
IndexDType optimal_index_dtype(int64_t vocab_size);
// Smallest and largest token id a dtype can store (for the integer dtypes).
int64_t index_dtype_min_value(IndexDType dtype);
int64_t index_dtype_max_value(IndexDType dtype);

}  // namespace megatune::executor::data
