// ParameterResidence: where a model chunk's compute-dtype parameters are read while Megatron FSDP
// optim_grads_params keeps only this rank's shard of them; GradientResidence: where its fp32 gradients are
// written while FSDP optim_grads / optim_grads_params keeps only this rank's shard of them. The data-parallel
// strategy gathers a bucket into storage of its own right before the model reads it, places that range of the
// chunk's buffer there, and releases it after the forward or backward that read it; the model reads a
// parameter only while placed.
#pragma once
#include <cstdint>

#include "executor/backend/backend.h"

namespace megatune::executor {

class ParameterResidence {
 public:
  virtual ~ParameterResidence() = default;
  // Elements [begin, end) of the chunk's buffer, parameters of entry `layer_code` (GradBufferEntry::group),
  // are read from `storage` ((1, end - begin), compute dtype) until release_parameters(layer_code, begin).
  virtual void place_parameters(int layer_code, std::int64_t begin, std::int64_t end, Tensor storage) = 0;
  virtual void release_parameters(int layer_code, std::int64_t begin) = 0;
};

// The strategy places a bucket's whole-bucket fp32 slot (zeroed) before the first pass of a micro-batch that
// writes its gradients (the LM head's forward, or the backward of its first entry), and releases it once the
// backward completing the bucket has run and the slot is reduce-scattered into this rank's shard.
class GradientResidence {
 public:
  virtual ~GradientResidence() = default;
  // The gradients of elements [begin, end) of the chunk's buffer are written to `storage` ((1, end - begin)
  // fp32, zero) until release_gradients(begin): their first GEMM write in it overwrites.
  virtual void place_gradients(std::int64_t begin, std::int64_t end, Tensor storage) = 0;
  virtual void release_gradients(std::int64_t begin) = 0;
};

}  // namespace megatune::executor
