// Conversion between Hugging Face model folders (config.json + safetensors) and megatune checkpoints.
// Import writes iteration 0 of a checkpoint (fresh AdamW moments) that `megatune train --load` resumes with
// no model flags (the checkpoint records them as "model_args"): one shard, or one shard per rank of a given
// layout. Export reads any megatune checkpoint, whatever its layout (its tensor-parallel slices assembled by
// the resharding reader, checkpoint_shards.h), into one full model.
#pragma once
#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "executor/checkpoint/checkpoint_format.h"
#include "executor/checkpoint/hf_model.h"
#include "layouts/parallel_config.h"

namespace megatune::executor {

// A whole model's parameters by Megatron name, each unsharded (row-major, its global shape).
using FullParameters = std::map<std::string, std::vector<float>>;

// The parameters of the HF folder `directory` (whose config.json gave `model`), the vocabulary padded with
// zero rows to padded_vocab. UserError naming the tensor for a missing tensor, a shape that differs from
// the config's, or a tensor no parameter reads.
FullParameters read_hf_parameters(const std::string& directory, const checkpoint::HfModel& model,
                                  int64_t padded_vocab);

// Writes `parameters` as iteration 0 of a checkpoint in save_root: one shard when `layout` is null (or one
// rank), else every rank's shard of that layout. `provenance` goes into the metadata ("converted_from").
void write_converted_checkpoint(const std::string& save_root, const checkpoint::HfModel& model,
                                const FullParameters& parameters, const layouts::ParallelConfig* layout,
                                const std::string& provenance);

// The model_args a checkpoint records (empty when it records none: a save from before them).
std::vector<std::string> checkpoint_model_args(const std::string& load_root);

// The full parameters of the latest iteration under load_root, a checkpoint of `model` (its model_config
// is checked against it); the vocabulary rows as saved (padded for the saving run's tp).
FullParameters read_checkpoint_parameters(const std::string& load_root, const layouts::ModelSpec& model,
                                          const layouts::ModelNumerics& numerics, int64_t* padded_vocab);

// Writes the HF folder: safetensors in `dtype` (fp32 or bf16; sharded with an index above max_shard_bytes)
// and config.json last. The folder must be empty or absent. Returns the files written.
std::vector<std::string> write_hf_folder(const std::string& directory, const checkpoint::HfModel& model,
                                         const FullParameters& parameters, checkpoint::TensorDType dtype,
                                         int64_t max_shard_bytes);

}  // namespace megatune::executor
