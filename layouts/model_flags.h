// The Megatron-LM flags that rebuild a ModelSpec (its shape, normalization, activation, positions, biases,
// MLA, MoE, MTP) plus the RoPE base and norm epsilon: what a checkpoint records ("model_args") so that a
// run resuming it, or a conversion reading it, needs no model flags.
#pragma once
#include <string>
#include <vector>

#include "layouts/model_spec.h"

namespace megatune::layouts {

// The model's numerics beyond the ModelSpec: megatune train's --rotary-base and --norm-epsilon.
struct ModelNumerics {
  double rotary_base = 10000.0;
  double norm_epsilon = 1e-5;
};

// e.g. {"--num-layers", "2", "--hidden-size", "64", ..., "--rotary-base", "10000", "--norm-epsilon",
// "1e-05"}: every field written explicitly (no preset), so a later change of a preset cannot change it.
std::vector<std::string> model_flags(const ModelSpec& model, const ModelNumerics& numerics);
// The flags as one line, separated by single spaces (no value holds a space), and back.
std::string join_model_flags(const std::vector<std::string>& flags);
std::vector<std::string> split_model_flags(const std::string& line);

}  // namespace megatune::layouts
