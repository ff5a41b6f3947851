// ParameterResidence: where a model chunk's compute-dtype parameters are read while Megatron FSDP
// optim_grads_params keeps only this rank's shard of them. The data-parallel strategy gathers a bucket into
// storage of its own right before the model reads it, places that range of the chunk's buffer there, and
// releases it after the forward or backward that read it; the model reads a parameter only while placed.
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

}  // namespace megatune::executor
