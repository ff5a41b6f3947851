// The routers' expert biases: the data-parallel update and the checkpoint tensors.
#include "executor/training/expert_bias_state.h"

#include <algorithm>
#include <string>

#include "base/user_error.h"
#include "executor/backend/recording_pause.h"
#include "executor/parallel/grad_buckets.h"

namespace megatune::executor {

void update_router_expert_biases(GPTModel& chunk, Communicator& communicator, Tensor scratch) {
  MoeLayers* moe = chunk.moe_layers();
  if (moe == nullptr || !moe->has_expert_bias()) return;
  Backend& backend = communicator.backend();
  std::vector<float> counts;  // exact below 2^24 tokens per expert
  for (int l = 0; l < moe->layers(); ++l)
    for (double n : moe->tokens_since_update(l)) counts.push_back(static_cast<float>(n));
  // Megatron sums them over TP x CP x DP: every rank routed its own tokens (a sequence shard under TP).
  for (CommGroup group : {CommGroup::kTensor, CommGroup::kDataContext}) {
    if (communicator.size(group) == 1) continue;
    RecordingPause pause(backend);
    const Tensor t = flat_range(backend, scratch, 0, static_cast<std::int64_t>(counts.size()));
    backend.upload(t, counts.data());
    communicator.all_reduce(group, t, ReduceOp::kSum,
                            {"expert_bias_counts_ar", -1, layouts::OpPhase::kOptimizer});
    backend.download(t, counts.data());
  }
  moe->apply_expert_bias_update(std::vector<double>(counts.begin(), counts.end()));
}

void save_expert_biases(checkpoint::CheckpointWriter& writer, GPTModel& chunk) {
  MoeLayers* moe = chunk.moe_layers();
  if (moe == nullptr || !moe->has_expert_bias()) return;
  const std::vector<int> layers = chunk.moe_layer_numbers();
  for (int l = 0; l < moe->layers(); ++l)
    writer.add_tensor("model." + layer_parameter(layers[l], "mlp.router.expert_bias"),
                      checkpoint::TensorDType::fp32, {chunk.config().num_experts},
                      moe->expert_bias(l).data());
}

void load_expert_biases(const std::vector<const checkpoint::CheckpointReader*>& shards, GPTModel& chunk) {
  MoeLayers* moe = chunk.moe_layers();
  if (moe == nullptr || !moe->has_expert_bias()) return;
  const std::vector<int> layers = chunk.moe_layer_numbers();
  for (int l = 0; l < moe->layers(); ++l) {
    const std::string name = "model." + layer_parameter(layers[l], "mlp.router.expert_bias");
    const auto holder =
        std::find_if(shards.begin(), shards.end(),
                     [&](const checkpoint::CheckpointReader* r) { return r->find_tensor(name) != nullptr; });
    if (holder == shards.end())
      throw UserError(
          "checkpoint " + shards.front()->directory() + " holds no " + name +
          " (saved without --moe-router-enable-expert-bias); resume with the flags it was saved with");
    (*holder)->read_tensor(name, checkpoint::TensorDType::fp32, {chunk.config().num_experts},
                           moe->expert_bias(l).data());
  }
}

}  // namespace megatune::executor
