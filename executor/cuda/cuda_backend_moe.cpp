// CudaBackend's MoE permutation kernels: the plan's indices come from the MoeIndexCache (one H2D copy per
// plan change), the kernels from moe_kernels.cu. Shapes the kernels do not take (a hidden size that is not
// a multiple of 8, strided views) run through the Backend's host path.
#include <cuda_bf16.h>

#include "executor/cuda/cuda_backend.h"
#include "executor/cuda/moe_index_cache.h"
#include "executor/cuda/moe_kernels.h"

namespace megatune::executor {
namespace {

cuda::bf16* b16(Tensor t) { return static_cast<cuda::bf16*>(t.data); }

// The device kernels take contiguous bf16 tensors of the same width, that width a multiple of 8.
bool on_device(std::initializer_list<Tensor> tensors) {
  for (const Tensor& t : tensors)
    if (t.dtype != DType::kBF16 || t.is_int32 || !t.contiguous() || !cuda::moe_kernels_support(t.cols) ||
        t.cols != tensors.begin()->cols || reinterpret_cast<std::uintptr_t>(t.data) % 16 != 0)
      return false;
  return true;
}

}  // namespace

CudaBackend::MoeTransfers CudaBackend::moe_transfers() const {
  return {moe_indices_->uploads(), moe_d_probs_downloads_};
}

void CudaBackend::do_moe_permute(Tensor x, const MoePermutation& plan, Tensor out) {
  if (!on_device({x, out})) return Backend::do_moe_permute(x, plan, out);
  const cuda::DeviceMoePlan d = moe_indices_->get(plan, compute_stream());
  cuda::moe_permute(b16(x), d.row_token, plan.rows(), x.cols, b16(out), compute_stream());
}

void CudaBackend::do_moe_unpermute(Tensor rows, const MoePermutation& plan, bool weighted, Tensor out) {
  if (!on_device({rows, out})) return Backend::do_moe_unpermute(rows, plan, weighted, out);
  const cuda::DeviceMoePlan d = moe_indices_->get(plan, compute_stream());
  cuda::moe_unpermute(b16(rows), d.token_rows, weighted ? d.token_probs : nullptr, plan.tokens, plan.topk,
                      out.cols, b16(out), compute_stream());
}

void CudaBackend::do_moe_unpermute_backward(Tensor d_out, Tensor rows, const MoePermutation& plan,
                                            Tensor d_rows, std::vector<float>& d_probs) {
  if (!on_device({d_out, rows, d_rows}))
    return Backend::do_moe_unpermute_backward(d_out, rows, plan, d_rows, d_probs);
  const cuda::DeviceMoePlan d = moe_indices_->get(plan, compute_stream());
  cuda::moe_unpermute_backward(b16(d_out), b16(rows), d.token_rows, d.token_probs, plan.tokens, plan.topk,
                               d_out.cols, b16(d_rows), d.d_probs, compute_stream());
  // The router's backward runs on the host (as the forward's routing): the one wait of the layer's backward.
  moe_indices_->download_d_probs(plan, compute_stream(), d_probs);
  ++moe_d_probs_downloads_;
}

}  // namespace megatune::executor
