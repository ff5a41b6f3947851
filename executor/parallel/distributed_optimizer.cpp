// DistributedOptimizer: owned ranges per bucket, the multi-tensor table cut to them, the step and the
// bucketed param all-gather.
#include "executor/parallel/distributed_optimizer.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "executor/backend/backend.h"

namespace megatune::executor {

using layouts::OpPhase;

namespace {

void require_buffer(const Tensor& t, const GradBufferLayout& layout, const char* what) {
  if (t.rows != 1 || t.cols < layout.total_elements())
    throw std::invalid_argument(std::string("DistributedOptimizer: ") + what +
                                " must be a (1, >= " + std::to_string(layout.total_elements()) + ") buffer");
}

}  // namespace

DistributedOptimizer::DistributedOptimizer(Communicator& communicator, const GradBufferLayout& layout,
                                           const OptimizerBuffers& buffers,
                                           const DistributedOptimizerOptions& options)
    : communicator_(communicator),
      backend_(communicator.backend()),
      layout_(layout),
      buffers_(buffers),
      options_(options),
      has_main_params_(buffers.main_params.cols > 0),
      norm_(communicator.backend()) {
  require_layout_for_group(layout, communicator, options.group, "DistributedOptimizer");
  require_buffer(buffers.grads, layout, "grads");
  require_buffer(buffers.model_params, layout, "model_params");
  if (has_main_params_) require_buffer(buffers.main_params, layout, "main_params");
  const int rank = communicator.rank(options.group);
  for (int b = 0; b < static_cast<int>(layout.buckets().size()); ++b) {
    const GradBucketRange& bucket = layout.buckets()[b];
    OwnedRange r;
    r.bucket = b;
    r.begin = options.sharded ? layout.shard_begin(b, rank) : bucket.begin;
    r.end = options.sharded ? r.begin + layout.shard_elements(b) : bucket.end;
    r.state_offset = owned_elements_;
    owned_elements_ += r.end - r.begin;
    owned_.push_back(r);
  }
  const std::int64_t state = std::max<std::int64_t>(owned_elements_, 1);
  if (!has_main_params_) master_ = backend_.allocate(DType::kFP32, 1, state, "fp32 master params (owned)");
  exp_avg_ = backend_.allocate(DType::kFP32, 1, state, "AdamW exp_avg, exp_avg_sq (fp32, owned)");
  exp_avg_sq_ = backend_.allocate(DType::kFP32, 1, state, "AdamW exp_avg, exp_avg_sq (fp32, owned)");
  if (backend_.sizing()) return;
  backend_.fill_zero(exp_avg_);
  backend_.fill_zero(exp_avg_sq_);
  backend_.prepare_optimizer(optimizer_tensors());
}

std::vector<OptimizerTensor> DistributedOptimizer::optimizer_tensors() const {
  const int tp_rank = communicator_.rank(CommGroup::kTensor);
  const bool owns_replicated = options_.sharded || communicator_.rank(options_.group) == 0;
  std::vector<OptimizerTensor> tensors;
  for (const OwnedRange& r : owned_) {
    const GradBucketRange& bucket = layout_.buckets()[r.bucket];
    for (int e = bucket.first_entry; e < bucket.end_entry; ++e) {
      const GradBufferEntry& entry = layout_.entries()[e];
      const std::int64_t lo = std::max(r.begin, layout_.offset(e));
      const std::int64_t hi = std::min(r.end, layout_.offset(e) + entry.numel);
      if (hi <= lo) continue;
      const std::int64_t state = r.state_offset + (lo - r.begin), n = hi - lo;
      OptimizerTensor t;
      t.main_param = has_main_params_ ? flat_range(backend_, buffers_.main_params, lo, n)
                                      : flat_range(backend_, master_, state, n);
      t.main_grad = flat_range(backend_, buffers_.grads, lo, n);
      t.exp_avg = flat_range(backend_, exp_avg_, state, n);
      t.exp_avg_sq = flat_range(backend_, exp_avg_sq_, state, n);
      t.model_param = flat_range(backend_, buffers_.model_params, lo, n);
      t.apply_weight_decay = entry.weight_decay;
      t.in_grad_norm = owns_replicated && counts_in_grad_norm(entry, tp_rank);
      tensors.push_back(t);
    }
  }
  return tensors;
}

void DistributedOptimizer::initialize_master_params(Tensor full) {
  if (has_main_params_) return;
  require_buffer(full, layout_, "the parameters to initialize from");
  for (const OwnedRange& r : owned_)
    backend_.copy(flat_range(backend_, full, r.begin, r.end - r.begin),
                  flat_range(backend_, master_, r.state_offset, r.end - r.begin));
}

DistributedOptimizer::StepResult DistributedOptimizer::step(const AdamWHyper& hyper) {
  StepResult result;
  result.grad_norm = norm_.compute(communicator_);
  result.skipped = !std::isfinite(result.grad_norm);
  if (result.skipped) return result;
  backend_.adamw_step(hyper, {"adamw", -1, OpPhase::kOptimizer});
  if (options_.sharded) gather_params();
  return result;
}

void DistributedOptimizer::gather_params() {
  const int group_size = communicator_.size(options_.group);
  const OpTag tag{"param_ag", -1, OpPhase::kOptimizer, layouts::OpRole::kParamGather};
  for (const OwnedRange& r : owned_) {
    const GradBucketRange& bucket = layout_.buckets()[r.bucket];
    CommHandle h = communicator_.all_gather_async(
        options_.group, flat_range(backend_, buffers_.model_params, r.begin, r.end - r.begin),
        flat_range(backend_, buffers_.model_params, bucket.begin, bucket.numel(), group_size), tag);
    if (h) gathers_.push_back(std::move(h));
  }
  if (!options_.overlap_param_gather) wait_param_gather();
}

void DistributedOptimizer::wait_param_gather() {
  for (CommHandle& h : gathers_) h->wait();
  gathers_.clear();
}

}  // namespace megatune::executor
