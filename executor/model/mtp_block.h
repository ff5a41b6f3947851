// Multi-token prediction (Megatron's MultiTokenPredictionBlock, DeepSeek-V3's MTP): what a loss stage keeps
// per micro-batch slot and MTP layer, its shared scratch, and the host-side shifts of tokens, labels and
// positions. GPTModel runs the layers (executor/model/gpt_model_mtp.cpp).
#pragma once
#include <cstdint>
#include <vector>

#include "executor/backend/backend.h"
#include "executor/data/data_loader.h"

namespace megatune::executor {

// One MTP layer's tensors of one micro-batch in flight (rows: T, or T / tp under sequence parallelism).
struct MtpLayerSaved {
  Tensor tokens;                  // (T, 1) int32 this rank's ids of the shifted tokens (embedding lookup)
  Tensor embedding;               // (rows, h) the shared embedding's output: enorm's input
  Tensor enorm_mean, enorm_rstd;  // (rows, 1) fp32
  Tensor hnorm_mean, hnorm_rstd;  // (rows, 1) fp32
  Tensor concat;                  // (rows, 2h) [enorm(embedding) | hnorm(previous)]: eh_proj's input
  Tensor layer_in, layer_out;     // (rows, h) the transformer layer's input (eh_proj's output) and output
  Tensor final_norm;              // (rows, h) the layer's final norm output: head input, next hnorm input
  Tensor final_mean, final_rstd;  // (rows, 1) fp32
  Tensor head_grad;               // (T, h) the LM head's data gradient of final_norm (partial under TP)
};

struct MtpBuffers {
  std::vector<std::vector<MtpLayerSaved>> saved;  // [slot][MTP layer of the stage]
  Tensor norm_out;        // (rows, h) a norm's output before it is copied into its half of concat
  Tensor concat_full;     // (T, 2h) eh_proj's gathered input (sequence parallelism)
  Tensor proj_out;        // (T, h / tp) eh_proj's output on this rank (tp > 1)
  Tensor proj_gathered;   // (tp * T, h / tp) every rank's proj_out (tp > 1)
  Tensor d_concat_full;   // (T, 2h) eh_proj's data gradient (partial over TP)
  Tensor d_concat;        // (rows, 2h) its reduce-scatter (sequence parallelism; else d_concat_full)
  Tensor d_half;          // (rows, h) one half of d_concat, contiguous
  Tensor carry;           // (rows, h) hnorm's input gradient for the previous MTP layer's final norm
  Tensor main_head_grad;  // (rows, h) the main LM head's reduced gradient of the decoder's final norm output
  Tensor d_hidden;        // (rows, h) that output's whole gradient, when this stage holds the last layer
  Tensor targets;         // (T, 1) int32
  Tensor losses;          // (num_microbatches * MTP layers of the stage, T) fp32 per-token losses
  std::vector<double> counted;        // [microbatch * layers + layer] tokens counted in that loss
  std::vector<bool> eh_proj_written;  // per MTP layer: its eh_proj gradient holds this iteration's sum
};

// Megatron's roll_tensor(shifts=-1) applied `shift` times to each sequence of `seq` tokens: row i takes row
// i + shift of its sequence, the last `shift` rows take 0.
std::vector<std::int32_t> shifted_tokens(const std::vector<std::int32_t>& tokens, std::int64_t seq,
                                         int shift);
// The MTP loss targets at depth `shift`: the labels and the loss mask rolled alike (the last `shift` rows of
// each sequence masked); -1 where masked. counted: the unmasked rows.
std::vector<std::int32_t> shifted_targets(const data::MicroBatch& mb, std::int64_t seq, int shift,
                                          double& counted);
// The rolled position ids (learned positions): row i of a sequence at position i + shift, the last `shift`
// rows at position 0.
SequencePositions shifted_positions(std::int64_t seq, int shift);

}  // namespace megatune::executor
