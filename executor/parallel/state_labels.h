// The arena labels of the per-parameter training state: the model's buffers and a DataParallelStrategy's
// allocate under them, and the memory report (parameter_state_bytes) groups the arena by them.
#pragma once

namespace megatune::executor::state_label {

inline constexpr char kModelParams[] = "model parameters (compute dtype)";
inline constexpr char kMainParams[] = "fp32 main parameters";
inline constexpr char kMainGrads[] = "fp32 main gradients";
inline constexpr char kMoments[] = "AdamW exp_avg, exp_avg_sq (fp32)";

}  // namespace megatune::executor::state_label
