#include <cudaTypedefs.h>

#include <stdexcept>
#include <string>

#include "executor/cuda/cuda_check.h"
#include "executor/cuda/tma.h"

namespace megatune::executor::cuda {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* symbol = nullptr;
    cudaDriverEntryPointQueryResult status{};
    MEGATUNE_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &symbol, 12000,
                                                         cudaEnableDefault, &status));
    if (status != cudaDriverEntryPointSuccess || symbol == nullptr)
      throw std::runtime_error("tensor maps: the driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(symbol);
  }();
  return fn;
}

}  // namespace

CUtensorMap make_bf16_head_tile_map(const __nv_bfloat16* data, int64_t rows, int64_t heads, int64_t head_dim,
                                    int64_t row_stride, int box_rows) {
  CUtensorMap map;
  const cuuint64_t dims[3] = {cuuint64_t(head_dim), cuuint64_t(heads), cuuint64_t(rows)};
  const cuuint64_t strides[2] = {cuuint64_t(head_dim) * sizeof(__nv_bfloat16),
                                 cuuint64_t(row_stride) * sizeof(__nv_bfloat16)};
  const cuuint32_t box[3] = {64, 1, cuuint32_t(box_rows)};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult result =
      encode_tiled()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<__nv_bfloat16*>(data), dims,
                     strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                     CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS)
    throw std::invalid_argument("tensor maps: cuTensorMapEncodeTiled rejected a " + std::to_string(rows) +
                                " x " + std::to_string(heads) + " x " + std::to_string(head_dim) +
                                " map (error " + std::to_string(int(result)) + ")");
  return map;
}

}  // namespace megatune::executor::cuda
