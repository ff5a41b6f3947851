// The parameter table of a GPT / Llama / Mixtral / DeepSeek-style pipeline stage: every parameter's name,
// shape on one tensor-parallel rank, tensor-parallel split (Megatron's TP plan: column-parallel QKV / fc1 /
// MLA up-projections / MTP eh_proj and the vocab-parallel embedding and LM head split their rows,
// row-parallel proj / fc2 their columns, the rest (norms, MLA down-projections) is replicated; MoE layers: a
// replicated router, this expert-parallel rank's experts split the same way over the expert-tensor-parallel
// group, a shared expert split like the dense MLP),
// initialization and weight-decay class. One home for these facts: the executor's ParameterLayout, its
// checkpoints and the step program's gradient-buffer sizes read it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace megatune::layouts {

enum class TensorParallelSplit { kReplicated, kRows, kColumns };
enum class ParameterInit { kNormal, kScaledNormal, kOnes, kZeros };

struct RankShape;  // layouts/rank_shape.h

// What a stage holds: decoder layers [first_layer, first_layer + num_layers) (global numbering; -1: all),
// the embedding, the final norm + LM head + loss, and MTP layers [first_mtp_layer, first_mtp_layer +
// num_mtp_layers) (each: enorm, hnorm, eh_proj, one transformer layer, its final norm). A stage with MTP
// layers and without the embedding holds its own copy of the word embedding (Megatron's MTP stage
// embedding, reduced with the first stage's like a tied one) before its first MTP layer.
struct StageContents {
  int first_layer = 0;
  int num_layers = -1;
  bool has_embedding = true;
  bool has_loss = true;
  int first_mtp_layer = 0;
  int num_mtp_layers = 0;
};

struct PipelineStage;
// What a stage of a parsed pipeline layout holds.
StageContents contents_of(const PipelineStage& stage);

struct ParameterSpec {
  std::string name;  // Megatron-like: "decoder.layers.3.mlp.linear_fc1.weight", "mtp.layers.0.eh_proj.weight"
  // Global decoder layer; -1 embedding, -2 final norm / output layer, -3 - k MTP layer k (the step program's
  // numbering).
  int layer = -1;
  std::int64_t rows = 0, cols = 0;  // on one TP rank; 1-D parameters have rows == 1
  ParameterInit init = ParameterInit::kNormal;
  bool weight_decay = true;  // false for 1-D parameters
  TensorParallelSplit split = TensorParallelSplit::kReplicated;
  // The unsharded tensor concatenates parts along the split dimension, each split over TP on its own (QKV:
  // [q | k | v]; SwiGLU fc1: [gate | up]; MLA q up-projection: [q_nope | q_pos_emb], kv up-projection:
  // [k_nope | v]); global sizes of the parts (one part: the whole dimension). Inside a part the rows are
  // head-major; the rotary rows of a head are in rotate-half order (Megatron's MLA RoPE de-interleaves the
  // head's rotary features first: the same function of the weights up to this fixed row order).
  std::vector<std::int64_t> global_parts;
  // Replicated over TP with a partial gradient on each rank, all-reduced over TP after the schedule: a norm
  // (or MLA down-projection, router) under SP; the qk head norms (--qk-layernorm) whenever tp > 1.
  bool sequence_parallel_grad = false;
  bool gemm_weight = false;  // read by a GEMM (linear layers, the LM head)
  // A routed expert's weight: its global expert index (reduced over expert-dp; its split is over the
  // expert-tensor-parallel group, not TP).
  int expert = -1;
  std::int64_t numel() const { return rows * cols; }
  std::int64_t global_rows() const;
  std::int64_t global_cols() const;
};

// In forward order. A tied LM head on a stage without the embedding is the stage's own copy of
// "embedding.word_embeddings.weight".
std::vector<ParameterSpec> stage_parameter_table(const RankShape& shape, const StageContents& stage);

// "mtp.layers.<k>.<suffix>"; an MTP layer's transformer layer is "mtp.layers.<k>.transformer_layer.<...>".
std::string mtp_parameter(int mtp_layer, const std::string& suffix);

// Elements each parameter occupies in the flat parameter and gradient buffers (starts 64-element aligned).
constexpr std::int64_t kParameterAlignElements = 64;
inline std::int64_t aligned_elements(std::int64_t n) {
  return (n + kParameterAlignElements - 1) / kParameterAlignElements * kParameterAlignElements;
}

}  // namespace megatune::layouts
