// Token dtypes of Megatron's indexed dataset: codes, sizes, names and value ranges.
#include "executor/data/index_dtype.h"

#include <limits>

namespace megatune::executor::data {

std::optional<IndexDType> index_dtype_from_code(uint8_t code) {
  if (code >= 1 && code <= 8) return static_cast<IndexDType>(code);
  return std::nullopt;
}

int64_t index_dtype_size_bytes(IndexDType dtype) {
  switch (dtype) {
    case IndexDType::uint8:
    case IndexDType::int8:
      return 1;
    case IndexDType::int16:
    case IndexDType::uint16:
      return 2;
    case IndexDType::int32:
    case IndexDType::float32:
      return 4;
    case IndexDType::int64:
    case IndexDType::float64:
      return 8;
  }
  return 0;
}

std::string index_dtype_name(IndexDType dtype) {
  switch (dtype) {
    case IndexDType::uint8:
      return "uint8";
    case IndexDType::int8:
      return "int8";
    case IndexDType::int16:
      return "int16";
    case IndexDType::int32:
      return "int32";
    case IndexDType::int64:
      return "int64";
    case IndexDType::float64:
      return "float64";
    case IndexDType::float32:
      return "float32";
    case IndexDType::uint16:
      return "uint16";
  }
  return "unknown";
}

bool index_dtype_is_integer(IndexDType dtype) {
  return dtype != IndexDType::float32 && dtype != IndexDType::float64;
}

IndexDType optimal_index_dtype(int64_t vocab_size) {
  return vocab_size < 65500 ? IndexDType::uint16 : IndexDType::int32;
}

int64_t index_dtype_min_value(IndexDType dtype) {
  switch (dtype) {
    case IndexDType::uint8:
    case IndexDType::uint16:
      return 0;
    case IndexDType::int8:
      return std::numeric_limits<int8_t>::min();
    case IndexDType::int16:
      return std::numeric_limits<int16_t>::min();
    case IndexDType::int32:
      return std::numeric_limits<int32_t>::min();
    case IndexDType::int64:
    case IndexDType::float32:
    case IndexDType::float64:
      return std::numeric_limits<int64_t>::min();
  }
  return 0;
}

int64_t index_dtype_max_value(IndexDType dtype) {
  switch (dtype) {
    case IndexDType::uint8:
      return std::numeric_limits<uint8_t>::max();
    case IndexDType::uint16:
      return std::numeric_limits<uint16_t>::max();
    case IndexDType::int8:
      return std::numeric_limits<int8_t>::max();
    case IndexDType::int16:
      return std::numeric_limits<int16_t>::max();
    case IndexDType::int32:
      return std::numeric_limits<int32_t>::max();
    case IndexDType::int64:
    case IndexDType::float32:
    case IndexDType::float64:
      return std::numeric_limits<int64_t>::max();
  }
  return 0;
}

}  // namespace megatune::executor::data
