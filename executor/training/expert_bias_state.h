// The MoE routers' expert biases as training state (--moe-router-enable-expert-bias): their update after
// each iteration's gradient reduction and their place in checkpoints. Biases are buffers, not parameters:
// no gradient, no optimizer state; checkpoints hold them as
// "model.decoder.layers.<l>.mlp.router.expert_bias".
#pragma once
#include <vector>

#include "executor/checkpoint/checkpoint_reader.h"
#include "executor/checkpoint/checkpoint_writer.h"
#include "executor/model/gpt_model.h"
#include "executor/parallel/communicator.h"

namespace megatune::executor {

// Megatron's _update_router_expert_bias (finalize_model_grads): the tokens each of the chunk's experts got
// this iteration, summed over the data-parallel ranks (not a step-program op; scratch: fp32 (1, >= L * E)),
// move every router's expert bias. No-op without expert biases.
void update_router_expert_biases(GPTModel& chunk, Communicator& communicator, Tensor scratch);
void save_expert_biases(checkpoint::CheckpointWriter& writer, GPTModel& chunk);
// From whichever of `shards` holds each bias; UserError naming the checkpoint when none does.
void load_expert_biases(const std::vector<const checkpoint::CheckpointReader*>& shards, GPTModel& chunk);

}  // namespace megatune::executor
