// Trainer::require_finite: Megatron's --check-for-nan-in-loss-and-grad, one line naming the iteration and the
// first rank whose own loss or gradients are not finite.
#include <cmath>
#include <sstream>

#include "base/user_error.h"
#include "executor/training/trainer.h"

namespace megatune::executor {

void Trainer::require_finite(const std::string& what, double global, double local) {
  if (!config_.check_for_nan_in_loss_and_grad || std::isfinite(global)) return;
  // Every rank holds the same reduced `global`, so every rank takes part in this reduction: the largest of
  // world - rank over the ranks whose own part is not finite names the lowest such rank.
  const int world = communicator_.world_size(), rank = communicator_.world_rank();
  const double flagged =
      world_reduce(std::isfinite(local) ? 0.0 : static_cast<double>(world - rank), ReduceOp::kMax);
  std::ostringstream line;
  line << "iteration " << iteration_ + 1 << ": the " << what << " is "
       << (std::isnan(global) ? "NaN"
           : global > 0       ? "inf"
                              : "-inf");
  if (flagged > 0)
    line << " (first non-finite on rank " << world - static_cast<int>(flagged) << " of " << world << ")";
  else
    line << " (every rank's own part is finite: their sum overflows)";
  line << "; the run stopped (--check-for-nan-in-loss-and-grad): lower --lr or check the data, or pass "
          "--no-check-for-nan-in-loss-and-grad to skip such iterations";
  throw UserError(line.str());
}

}  // namespace megatune::executor
