// Checks of `megatune train`'s optimizer, schedule and checkpoint flags before anything is built: NaN,
// infinities, zero or negative values where they make no sense (--lr nan, --adam-eps 0, --adam-beta1 2,
// --train-iters 0) are refused with one line naming the flag and a valid value, and --load / --save are
// checked against the checkpoint directories they name (executor/checkpoint/run_lineage.h).
#pragma once
#include <string>

#include "executor/training/run_setup.h"

namespace megatune::tools {

// Throws UserError (one line naming the flag) for the first option that makes no sense.
void validate_train_options(const executor::TrainOptions& options);

// --load: refuses a path that does not exist (or holds iterations without a tracker); returns the line to
// print when it exists but holds no checkpoint ("" otherwise, or without --load).
std::string check_load_path(const std::string& load);

}  // namespace megatune::tools
