// Hugging Face folders <-> megatune checkpoints: parameters by name, vocabulary padding, shards per rank.
#include "executor/training/hf_conversion.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "base/user_error.h"
#include "executor/checkpoint/checkpoint_writer.h"
#include "executor/checkpoint/durable_file.h"
#include "executor/checkpoint/run_lineage.h"
#include "executor/checkpoint/safetensors_folder.h"
#include "executor/checkpoint/saved_iteration.h"
#include "executor/model/parameter_layout.h"
#include "executor/training/checkpoint_shards.h"
#include "executor/training/run_setup.h"
#include "layouts/rank_grid.h"

namespace megatune::executor {
namespace {

namespace fs = std::filesystem;
using checkpoint::HfBinding;
using checkpoint::HfModel;
using checkpoint::HfPiece;

// The whole model on one rank, its vocabulary padded to padded_vocab.
ParameterLayout full_layout(const layouts::ModelSpec& spec, const layouts::ModelNumerics& numerics,
                            int64_t padded_vocab) {
  TransformerConfig config = transformer_config_from(spec, 1, static_cast<float>(numerics.rotary_base),
                                                     static_cast<float>(numerics.norm_epsilon), 0.02f);
  config.vocab_size = padded_vocab;
  return ParameterLayout(config);
}

int64_t elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string hf_shape_text(const std::vector<int64_t>& shape) {
  std::string text = "(";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + ")";
}

// (rows, cols) row-major -> (cols, rows).
std::vector<float> transpose(const std::vector<float>& values, int64_t rows, int64_t cols) {
  std::vector<float> out(values.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = values[r * cols + c];
  return out;
}

std::string checkpoint_model_config(const layouts::ModelSpec& spec, const layouts::ModelNumerics& numerics,
                                    int tp) {
  return transformer_config_from(spec, tp, static_cast<float>(numerics.rotary_base),
                                 static_cast<float>(numerics.norm_epsilon), 0.02f)
      .describe();
}

void add_training_state(checkpoint::CheckpointWriter& writer, const HfModel& model, int tp,
                        const std::string& provenance) {
  writer.add_metadata_int("iteration", 0);
  writer.add_metadata_int("consumed_samples", 0);
  writer.add_metadata_int("skipped_iterations", 0);
  writer.add_metadata_int("seed", 1234);
  writer.add_metadata("model_config", checkpoint_model_config(model.spec, model.numerics, tp));
  writer.add_metadata("lr_decay_style", "linear");
  writer.add_metadata("model_args",
                      layouts::join_model_flags(layouts::model_flags(model.spec, model.numerics)));
  writer.add_metadata("converted_from", provenance);
}

// One rank's parameters (and zero AdamW moments) of the chunks it holds.
void add_rank_tensors(checkpoint::CheckpointWriter& writer, const TransformerConfig& config, int tp_rank,
                      const std::vector<StageSpan>& chunks, const FullParameters& parameters) {
  for (const StageSpan& chunk : chunks) {
    const ParameterLayout layout(config, chunk);
    for (const ParameterEntry& e : layout.entries()) {
      const auto found = parameters.find(e.name);
      if (found == parameters.end() ||
          static_cast<int64_t>(found->second.size()) != e.global_rows() * e.global_cols())
        throw std::invalid_argument("write_converted_checkpoint: no values of " + e.name + "'s global shape");
      const bool expert = e.expert >= 0;
      const int rank = expert ? config.expert_tensor_parallel_rank : tp_rank;
      const int size = expert ? config.expert_tensor_parallel_size : config.tensor_parallel_size;
      const std::vector<float> local = tensor_parallel_slice(e, found->second, rank, size);
      const std::vector<int64_t> shape =
          e.rows == 1 ? std::vector<int64_t>{e.cols} : std::vector<int64_t>{e.rows, e.cols};
      writer.add_tensor("model." + e.name, checkpoint::TensorDType::fp32, shape, local.data());
      const std::vector<float> zeros(local.size(), 0.0f);
      writer.add_tensor("optimizer.exp_avg." + e.name, checkpoint::TensorDType::fp32, shape, zeros.data());
      writer.add_tensor("optimizer.exp_avg_sq." + e.name, checkpoint::TensorDType::fp32, shape, zeros.data());
    }
  }
}

}  // namespace

FullParameters read_hf_parameters(const std::string& directory, const HfModel& model, int64_t padded_vocab) {
  const checkpoint::SafetensorsFolder folder(directory);
  HfModel named = model;
  if (model.architecture == checkpoint::HfArchitecture::kGpt2)
    named.tensor_prefix = folder.has("transformer.wte.weight") ? "transformer." : "";
  FullParameters out;
  std::set<std::string> consumed;
  for (const HfBinding& binding : checkpoint::hf_bindings(named)) {
    std::vector<float> values;
    for (const HfPiece& piece : binding.pieces) {
      const checkpoint::SafetensorsEntry& entry = folder.entry(piece.name);
      if (entry.shape != piece.shape)
        throw UserError(directory + ": tensor " + piece.name + " has shape " + hf_shape_text(entry.shape) +
                        " but config.json implies " + hf_shape_text(piece.shape) +
                        "; the config and the weights are of different models");
      std::vector<float> part = folder.read_floats(piece.name);
      if (piece.transposed) part = transpose(part, piece.shape[0], piece.shape[1]);
      values.insert(values.end(), part.begin(), part.end());
      consumed.insert(piece.name);
    }
    if (binding.vocab_rows) {
      const int64_t hidden = model.spec.hidden_size;
      values.resize(static_cast<size_t>(padded_vocab * hidden), 0.0f);
    }
    out[binding.parameter] = std::move(values);
  }
  for (const std::string& name : folder.tensor_names())
    if (!consumed.count(name) && !checkpoint::hf_tensor_ignored(named, name))
      throw UserError(directory + " holds tensor " + name + ", which no " +
                      checkpoint::to_string(model.architecture) +
                      " parameter of its config.json reads; is the config this model's?");
  // Every parameter of megatune's model has its values (the bindings mirror the parameter table).
  const ParameterLayout layout = full_layout(model.spec, model.numerics, padded_vocab);
  for (const ParameterEntry& e : layout.entries()) {
    const auto found = out.find(e.name);
    if (found == out.end() || static_cast<int64_t>(found->second.size()) != e.rows * e.cols)
      throw std::logic_error("hf conversion: no binding of the right size for " + e.name);
  }
  return out;
}

void write_converted_checkpoint(const std::string& save_root, const HfModel& model,
                                const FullParameters& parameters, const layouts::ParallelConfig* layout,
                                const std::string& provenance) {
  const std::string run_id = checkpoint::new_run_id();
  if (layout == nullptr || layout->world_size == 1) {
    checkpoint::CheckpointWriter writer(save_root, 0, {.run_id = run_id});
    TransformerConfig config =
        transformer_config_from(model.spec, 1, static_cast<float>(model.numerics.rotary_base),
                                static_cast<float>(model.numerics.norm_epsilon), 0.02f);
    add_rank_tensors(writer, config, 0, {StageSpan{}}, parameters);
    add_training_state(writer, model, 1, provenance);
    writer.commit();
    return;
  }
  if (layout->use_distributed_optimizer)
    throw UserError(
        "--use-distributed-optimizer: a converted checkpoint holds no optimizer shards; convert "
        "without it (train --load reshards it under the distributed optimizer)");
  TrainOptions options;
  options.rotary_base = model.numerics.rotary_base;
  options.norm_epsilon = model.numerics.norm_epsilon;
  const layouts::RankGrid grid = layouts::RankGrid::from_config(*layout);
  std::vector<std::string> shards;
  for (int rank = 0; rank < layout->world_size; ++rank) {
    const RunConfig run = build_run_config(model.spec, *layout, options, rank);
    checkpoint::CheckpointWriteOptions write;
    write.shard_name = rank_shard_name(rank);
    if (rank == 0) write.run_id = run_id;
    checkpoint::CheckpointWriter writer(save_root, 0, write);
    const layouts::DenseCoordinates dense = grid.dense_coordinates(rank);
    add_rank_tensors(writer, run.trainer.model, dense.tp, run.trainer.chunks, parameters);
    add_training_state(writer, model, layout->tp(), provenance);
    const layouts::ExpertCoordinates expert = grid.expert_coordinates(rank);
    ShardCoordinates c;
    c.world_size = layout->world_size;
    c.world_rank = rank;
    c.tp = dense.tp, c.pp = dense.pp, c.dp = dense.dp, c.cp = dense.cp, c.ep = expert.ep, c.etp = expert.etp;
    c.tp_size = layout->tp();
    c.etp_size = layout->etp();
    record_shard_coordinates(writer, c, run.layout_description);
    writer.commit_shard();
    shards.push_back(write.shard_name);
  }
  checkpoint::CheckpointWriter::finalize_iteration(save_root, 0, shards);
}

std::vector<std::string> checkpoint_model_args(const std::string& load_root) {
  const checkpoint::SavedIteration saved = checkpoint::SavedIteration::open_latest(load_root);
  const checkpoint::CheckpointReader first =
      saved.open_shard(saved.single_shard() ? checkpoint::kDefaultShardName : rank_shard_name(0));
  if (!first.has_metadata("model_args")) return {};
  return layouts::split_model_flags(first.metadata_value("model_args"));
}

FullParameters read_checkpoint_parameters(const std::string& load_root, const layouts::ModelSpec& spec,
                                          const layouts::ModelNumerics& numerics, int64_t* padded_vocab) {
  const checkpoint::SavedIteration saved = checkpoint::SavedIteration::open_latest(load_root);
  std::vector<checkpoint::CheckpointReader> shards;
  shards.push_back(
      saved.open_shard(saved.single_shard() ? checkpoint::kDefaultShardName : rank_shard_name(0)));
  const int64_t world =
      shards.front().has_metadata("world_size") ? shards.front().metadata_int("world_size") : 1;
  for (int r = 1; r < world; ++r) {
    shards.push_back(saved.open_shard(rank_shard_name(r)));
    require_shard_of_rank(shards.back(), r, shards.front());
  }
  const int tp =
      shards.front().has_metadata("tp_size") ? static_cast<int>(shards.front().metadata_int("tp_size")) : 1;
  shards.front().require_metadata_equal("model_config", checkpoint_model_config(spec, numerics, tp));
  *padded_vocab = spec.padded_vocab_size(tp);
  const ParameterLayout layout = full_layout(spec, numerics, *padded_vocab);
  FullParameters out;
  for (const ParameterEntry& e : layout.entries())
    out[e.name] = assemble_unsharded(shards, e, "model." + e.name);
  return out;
}

std::vector<std::string> write_hf_folder(const std::string& directory, const HfModel& model,
                                         const FullParameters& parameters, checkpoint::TensorDType dtype,
                                         int64_t max_shard_bytes) {
  std::error_code error;
  fs::create_directories(directory, error);
  if (error) throw UserError("cannot create " + directory + ": " + error.message() + "; check the path");
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<checkpoint::SafetensorsTensor> tensors;
  const std::vector<HfBinding> bindings = checkpoint::hf_bindings(model);
  for (const HfBinding& binding : bindings) {
    const std::vector<float>& values = parameters.at(binding.parameter);
    size_t at = 0;
    for (const HfPiece& piece : binding.pieces) {
      const auto n = static_cast<size_t>(elements(piece.shape));
      if (at + n > values.size()) throw std::logic_error("hf export: " + binding.parameter + " is too small");
      std::vector<float> part(values.begin() + static_cast<std::ptrdiff_t>(at),
                              values.begin() + static_cast<std::ptrdiff_t>(at + n));
      if (piece.transposed) part = transpose(part, piece.shape[1], piece.shape[0]);
      bytes.push_back(checkpoint::encode_floats(part, dtype));
      at += n;
    }
  }
  size_t k = 0;
  for (const HfBinding& binding : bindings)
    for (const HfPiece& piece : binding.pieces)
      tensors.push_back({piece.name, dtype, piece.shape, bytes[k++]});
  std::vector<std::string> files =
      checkpoint::write_safetensors_folder(directory, tensors, max_shard_bytes, {{"format", "pt"}});
  const std::string dtype_name = dtype == checkpoint::TensorDType::bf16 ? "bfloat16" : "float32";
  checkpoint::replace_file_atomically((fs::path(directory) / "config.json").string(),
                                      checkpoint::hf_config_text(model, dtype_name));
  files.push_back("config.json");
  return files;
}

}  // namespace megatune::executor
