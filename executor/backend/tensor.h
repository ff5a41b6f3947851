// Tensor: a typed 2-D view into backend memory (device memory for CUDA, host memory for the CPU backend).
#pragma once
#include <cstdint>
#include <stdexcept>

#include "layouts/op.h"

namespace megatune::executor {

using layouts::DType;

// A non-owning view: `rows` x `cols` elements of logical type `dtype`, row-major with `row_stride` elements
// between rows. The backend decides the storage type of a logical dtype (the CPU backend stores every
// floating type as float; the CUDA backend stores bf16 as bf16). Token ids use `is_int32`.
struct Tensor {
  void* data = nullptr;
  DType dtype = DType::kFP32;
  bool is_int32 = false;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t row_stride = 0;  // elements; == cols when contiguous

  std::int64_t numel() const { return rows * cols; }
  bool empty() const { return data == nullptr; }
  bool contiguous() const { return row_stride == cols; }
};

// Columns [first_col, first_col + cols) of t, same rows and row stride (storage_bytes: the backend's bytes
// per element of t's dtype).
inline Tensor columns_of(Tensor t, std::int64_t first_col, std::int64_t cols, std::int64_t storage_bytes) {
  Tensor v = t;
  if (t.data != nullptr) v.data = static_cast<char*>(t.data) + first_col * storage_bytes;
  v.cols = cols;
  return v;
}

// Rows [first_row, first_row + rows) of t, same columns and row stride.
inline Tensor rows_of(Tensor t, std::int64_t first_row, std::int64_t rows, std::int64_t storage_bytes) {
  Tensor v = t;
  if (t.data != nullptr) v.data = static_cast<char*>(t.data) + first_row * t.row_stride * storage_bytes;
  v.rows = rows;
  return v;
}

// A (rows, cols) contiguous view `offset` elements into a flat buffer (null data stays null: sizing mode).
inline Tensor carve(Tensor buffer, std::int64_t offset, std::int64_t rows, std::int64_t cols,
                    std::int64_t storage_bytes) {
  if (offset + rows * cols > buffer.numel()) throw std::logic_error("carve: view exceeds its buffer");
  Tensor v = buffer;
  if (buffer.data != nullptr) v.data = static_cast<char*>(buffer.data) + offset * storage_bytes;
  v.rows = rows;
  v.cols = cols;
  v.row_stride = cols;
  return v;
}

}  // namespace megatune::executor
