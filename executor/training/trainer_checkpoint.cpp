// Trainer's checkpoint state: save, load under the same layout, and load_resharded from another layout's
// shards (tensor-parallel and expert-tensor-parallel slices assembled, then sliced for this rank).
#include <algorithm>
#include <map>
#include <stdexcept>

#include "base/user_error.h"
#include "executor/checkpoint/checkpoint_reader.h"
#include "executor/checkpoint/checkpoint_writer.h"
#include "executor/training/checkpoint_shards.h"
#include "executor/training/expert_bias_state.h"
#include "executor/training/trainer.h"

namespace megatune::executor {

void Trainer::save(checkpoint::CheckpointWriter& writer) const {
  // Parameters whole (the distributed optimizer gathers its fp32 shards: every rank saves together); the
  // AdamW moments per parameter, or under the distributed optimizer this rank's shard of them as one tensor
  // per chunk ("optimizer.shard.*"), which resumes under the same layout only.
  for (std::size_t c = 0; c < chunks_.size(); ++c) {
    const GPTModel& model = *chunks_[c];
    const std::vector<float> params = data_parallel_->main_parameters(static_cast<int>(c));
    const DataParallelStrategy::Moments moments = data_parallel_->moments(static_cast<int>(c));
    const std::vector<float>& m = moments.exp_avg;
    const std::vector<float>& v = moments.exp_avg_sq;
    for (const ParameterEntry& e : model.layout().entries()) {
      const std::vector<std::int64_t> shape =
          e.rows == 1 ? std::vector<std::int64_t>{e.cols} : std::vector<std::int64_t>{e.rows, e.cols};
      writer.add_tensor("model." + e.name, checkpoint::TensorDType::fp32, shape, params.data() + e.offset);
      if (config_.use_distributed_optimizer) continue;
      writer.add_tensor("optimizer.exp_avg." + e.name, checkpoint::TensorDType::fp32, shape,
                        m.data() + e.offset);
      writer.add_tensor("optimizer.exp_avg_sq." + e.name, checkpoint::TensorDType::fp32, shape,
                        v.data() + e.offset);
    }
    save_expert_biases(writer, *chunks_[c]);
    if (config_.use_distributed_optimizer) {
      const std::string chunk = std::to_string(c);
      writer.add_tensor("optimizer.shard.exp_avg.chunk" + chunk, checkpoint::TensorDType::fp32,
                        {static_cast<std::int64_t>(m.size())}, m.data());
      writer.add_tensor("optimizer.shard.exp_avg_sq.chunk" + chunk, checkpoint::TensorDType::fp32,
                        {static_cast<std::int64_t>(v.size())}, v.data());
    }
  }
  if (config_.use_distributed_optimizer) writer.add_metadata_int("distributed_optimizer_shards", 1);
  writer.add_metadata_int("iteration", iteration_);
  writer.add_metadata_int("consumed_samples", consumed_samples_);
  writer.add_metadata_int("skipped_iterations", skipped_iterations_);
  writer.add_metadata_int("seed", static_cast<std::int64_t>(config_.seed));
  writer.add_metadata("model_config", config_.model.describe());
  if (!config_.model_args.empty()) writer.add_metadata("model_args", config_.model_args);
  writer.add_metadata("lr_decay_style", to_string(config_.lr.style));
}

void Trainer::load(const checkpoint::CheckpointReader& reader, const CheckpointLoadScope& scope) {
  reader.require_metadata_equal("model_config", config_.model.describe());
  const bool shards = reader.has_metadata("distributed_optimizer_shards");
  if (scope.optimizer && shards != config_.use_distributed_optimizer)
    throw UserError("checkpoint " + reader.directory() + (shards ? " holds" : " does not hold") +
                    " distributed-optimizer shards but this run " + (shards ? "does not use" : "uses") +
                    " --use-distributed-optimizer; resume with the flags it was saved with");
  for (std::size_t c = 0; c < chunks_.size(); ++c) {
    GPTModel& model = *chunks_[c];
    const std::int64_t total = model.layout().total_elements();
    std::vector<float> params(total, 0.0f), m(total, 0.0f), v(total, 0.0f);
    for (const ParameterEntry& e : model.layout().entries()) {
      const std::vector<std::int64_t> shape =
          e.rows == 1 ? std::vector<std::int64_t>{e.cols} : std::vector<std::int64_t>{e.rows, e.cols};
      reader.read_tensor("model." + e.name, checkpoint::TensorDType::fp32, shape, params.data() + e.offset);
      if (shards || !scope.optimizer) continue;
      reader.read_tensor("optimizer.exp_avg." + e.name, checkpoint::TensorDType::fp32, shape,
                         m.data() + e.offset);
      reader.read_tensor("optimizer.exp_avg_sq." + e.name, checkpoint::TensorDType::fp32, shape,
                         v.data() + e.offset);
    }
    data_parallel_->set_main_parameters(static_cast<int>(c), params);
    load_expert_biases({&reader}, *chunks_[c]);
    if (!scope.optimizer) continue;  // the moments stay as a new run's
    if (shards) {
      DataParallelStrategy::Moments own;
      const std::int64_t owned = data_parallel_->owned_elements(static_cast<int>(c));
      own.exp_avg.resize(static_cast<std::size_t>(owned));
      own.exp_avg_sq.resize(own.exp_avg.size());
      const std::string chunk = std::to_string(c);
      reader.read_tensor("optimizer.shard.exp_avg.chunk" + chunk, checkpoint::TensorDType::fp32, {owned},
                         own.exp_avg.data());
      reader.read_tensor("optimizer.shard.exp_avg_sq.chunk" + chunk, checkpoint::TensorDType::fp32, {owned},
                         own.exp_avg_sq.data());
      data_parallel_->set_moments(static_cast<int>(c), own);
    } else {
      data_parallel_->set_moments_from_whole(static_cast<int>(c), {std::move(m), std::move(v)});
    }
  }
  if (!scope.progress) return;
  iteration_ = reader.metadata_int("iteration");
  consumed_samples_ = reader.metadata_int("consumed_samples");
  skipped_iterations_ = reader.metadata_int("skipped_iterations");
}

void Trainer::load_resharded(const std::vector<checkpoint::CheckpointReader>& shards, const CheckpointLoadScope& scope) {
  if (shards.empty()) throw std::invalid_argument("load_resharded: no shards");
  shards.front().require_metadata_equal("model_config", config_.model.describe());
  // Slices of one save only: a shard of another iteration or run would be assembled into the parameters.
  for (const checkpoint::CheckpointReader& shard : shards)
    for (const char* key : {"iteration", "consumed_samples", "model_config"})
      if (shard.metadata_value(key) != shards.front().metadata_value(key))
        throw UserError("checkpoint shard " + shard.directory() + " holds " + key + " " +
                        shard.metadata_value(key) + " but " + shards.front().directory() + " holds " +
                        shards.front().metadata_value(key) +
                        "; the shards come from different saves: resume from a directory one save wrote");
  if (scope.optimizer && shards.front().has_metadata("distributed_optimizer_shards"))
    throw UserError(
        "checkpoint " + shards.front().directory() + " was saved under " +
        (shards.front().has_metadata("layout") ? shards.front().metadata_value("layout") : "another layout") +
        " with per-rank distributed-optimizer shards, which resume under that layout only; rerun with it");
  // One tensor's unsharded values from the shards' TP slices (checkpoint_shards.h), sliced for this rank.
  auto assemble = [&](const ParameterEntry& e, const std::string& name) {
    const CommGroup group = e.expert >= 0 ? CommGroup::kExpertTensor : CommGroup::kTensor;
    return tensor_parallel_slice(e, assemble_unsharded(shards, e, name), communicator_.rank(group),
                                 communicator_.size(group));
  };
  for (std::size_t c = 0; c < chunks_.size(); ++c) {
    GPTModel& model = *chunks_[c];
    const std::int64_t total = model.layout().total_elements();
    std::vector<float> params(total, 0.0f), m(total, 0.0f), v(total, 0.0f);
    for (const ParameterEntry& e : model.layout().entries()) {
      const auto put = [&](std::vector<float>& buffer, const std::string& prefix) {
        const std::vector<float> local = assemble(e, prefix + e.name);
        std::copy(local.begin(), local.end(), buffer.begin() + e.offset);
      };
      put(params, "model.");
      if (!scope.optimizer) continue;
      put(m, "optimizer.exp_avg.");
      put(v, "optimizer.exp_avg_sq.");
    }
    data_parallel_->set_main_parameters(static_cast<int>(c), params);
    std::vector<const checkpoint::CheckpointReader*> readers;
    for (const checkpoint::CheckpointReader& shard : shards) readers.push_back(&shard);
    load_expert_biases(readers, *chunks_[c]);
    if (scope.optimizer)
      data_parallel_->set_moments_from_whole(static_cast<int>(c), {std::move(m), std::move(v)});
  }
  if (!scope.progress) return;
  iteration_ = shards.front().metadata_int("iteration");
  consumed_samples_ = shards.front().metadata_int("consumed_samples");
  skipped_iterations_ = shards.front().metadata_int("skipped_iterations");
}

}  // namespace megatune::executor
