// The ops of multi-latent attention's projections in one layer pass (internal to the step-program builder,
// step_program.cpp): what the executor's MlaAttention issues, in its order.
#pragma once
#include "layouts/model_spec.h"
#include "layouts/op_sink.h"
#include "layouts/step_program.h"

namespace megatune::layouts {

// From the input norm's output to the attention core's q, k, v: the down-projections and latent norms on
// this rank's rows, the latents' all-gather under SP, the up-projections and the decoupled RoPE (with the
// input's all-gather first under SP when the query has one projection, no --q-lora-rank).
void mla_projections_forward(OpSink& o, const ModelSpec& model, const RankShape& s);
// After the attention core's backward, back to the input norm output's gradient: the rotary key's gradient
// summed over heads, the inverse RoPE, the up-projections' GEMMs, the latents' gradient reduction over TP,
// the latent norms' backward and the down-projections' GEMMs.
void mla_projections_backward(OpSink& o, const ModelSpec& model, const RankShape& s);

}  // namespace megatune::layouts
