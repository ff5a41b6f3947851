// The op phases and the TP role GPTModel's files tag their ops with (gpt_model*.cpp only).
#pragma once
#include "layouts/op.h"

namespace megatune::executor::gpt_model_phases {

using layouts::OpPhase;
inline constexpr OpPhase kF = OpPhase::kForward;
inline constexpr OpPhase kB = OpPhase::kBackward;
inline constexpr layouts::OpRole kTpRole = layouts::OpRole::kTensorParallel;

}  // namespace megatune::executor::gpt_model_phases
