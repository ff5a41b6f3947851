// DistributedOptimizer: AdamW over the parameters this data-parallel rank owns. Sharded (Megatron's
// --use-distributed-optimizer): the rank owns its 1/dp shard of every gradient bucket, holds fp32 master
// params and moments for that shard only, updates it, and all-gathers the updated params bucket by bucket.
// Replicated (without the flag): every rank owns and updates the whole buffer, nothing is gathered.
// The global gradient norm and clipping follow Megatron (grad_norm.h).
#pragma once
#include <vector>

#include "executor/backend/backend.h"
#include "executor/kernels/adamw_hyper.h"
#include "executor/parallel/communicator.h"
#include "executor/parallel/grad_buckets.h"
#include "executor/parallel/grad_norm.h"

namespace megatune::executor {

struct DistributedOptimizerOptions {
  bool sharded = true;  // Megatron's --use-distributed-optimizer
  // step() only launches the param all-gathers; wait_param_gather() must run before the next forward
  // reads the params (--overlap-param-gather). On the CPU the gathers complete eagerly.
  bool overlap_param_gather = false;
  CommGroup group = CommGroup::kDataContext;  // the group the buffer's buckets are reduced over
};

// Flat (1, >= layout.total_elements()) buffers laid out by the GradBufferLayout.
struct OptimizerBuffers {
  Tensor grads;         // fp32, reduced by a GradientReducer (sharded: reduce-scattered into the shard)
  Tensor model_params;  // model dtype: the weights the model computes with; receives the updated params
  // Optional fp32 master copy of the whole buffer, updated in place on the owned ranges (it may alias
  // model_params for an fp32 model). Empty: the optimizer holds fp32 master params for its owned ranges
  // only, filled by initialize_master_params().
  Tensor main_params;
};

// A range of the buffer this rank owns: elements [begin, end) of bucket `bucket`, held at
// [state_offset, state_offset + end - begin) of the optimizer's own state.
struct OwnedRange {
  int bucket = 0;
  std::int64_t begin = 0, end = 0;
  std::int64_t state_offset = 0;
};

class DistributedOptimizer {
 public:
  // Allocates the state from the backend's arena (run it in sizing mode and for real, like the model);
  // when not sizing, zeroes the moments and registers the owned pieces of every parameter with
  // Backend::prepare_optimizer (1-D views cut to the owned ranges; it replaces any table registered before).
  DistributedOptimizer(Communicator& communicator, const GradBufferLayout& layout,
                       const OptimizerBuffers& buffers, const DistributedOptimizerOptions& options);

  const std::vector<OwnedRange>& owned_ranges() const { return owned_; }
  std::int64_t owned_elements() const { return owned_elements_; }
  // Copies the owned ranges of a full fp32 parameter buffer (e.g. the initialized main params) into the
  // master params; a no-op when OptimizerBuffers::main_params was given.
  void initialize_master_params(Tensor full_fp32_params);

  struct StepResult {
    float grad_norm = 0.0f;
    bool skipped = false;  // non-finite global norm: no update on any rank
  };
  // Global grad norm, AdamW on the owned ranges (clipped by hyper.max_grad_norm against the global norm;
  // "adamw", phase kOptimizer), then (sharded) the all-gather of every bucket's updated params into
  // model_params ("param_ag"). A skipped step gathers nothing.
  StepResult step(const AdamWHyper& hyper);
  void wait_param_gather();  // with overlap_param_gather: the gathers step() launched

  // The optimizer's state over owned_elements() (checkpoints): fp32 (1, owned_elements()).
  Tensor exp_avg() const { return exp_avg_; }
  Tensor exp_avg_sq() const { return exp_avg_sq_; }
  Tensor master_params() const { return master_; }  // empty when main_params was given

 private:
  std::vector<OptimizerTensor> optimizer_tensors() const;
  void gather_params();

  Communicator& communicator_;
  Backend& backend_;
  const GradBufferLayout& layout_;
  OptimizerBuffers buffers_;
  DistributedOptimizerOptions options_;
  bool has_main_params_;  // OptimizerBuffers::main_params given (a (1, 0) tensor counts as not given)
  std::vector<OwnedRange> owned_;
  std::int64_t owned_elements_ = 0;
  Tensor master_, exp_avg_, exp_avg_sq_;  // (1, owned_elements_) fp32
  GlobalGradNorm norm_;
  std::vector<CommHandle> gathers_;
};

}  // namespace megatune::executor
