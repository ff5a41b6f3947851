// Megatron-LM's FP8 flags (--fp8-format, --fp8-recipe, --fp8-margin, --fp8-amax-history-len,
// --fp8-amax-compute-algo) into layouts::Fp8Settings, for the commands that train or price FP8.
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "layouts/fp8.h"

namespace megatune::tools {

// Registers the flags on app, filling settings; a recipe megatune does not run (mxfp8, blockwise) is
// refused in one line naming the ones it runs.
void add_fp8_flags(CLI::App& app, layouts::Fp8Settings& settings);
// The flags that reproduce settings (empty without FP8), in Megatron's spelling.
std::vector<std::string> fp8_flag_arguments(const layouts::Fp8Settings& settings);

}  // namespace megatune::tools
