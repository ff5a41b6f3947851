// TransformerConfig validation and a one-line description.
#include "executor/model/transformer_config.h"

#include <sstream>

#include "layouts/user_error.h"

namespace megatune::executor {

void TransformerConfig::validate() const {
  auto require = [](bool ok, const std::string& message) {
    if (!ok) throw UserError(message);
  };
  require(num_layers >= 1, "--num-layers must be >= 1");
  require(hidden >= 1 && heads >= 1 && head_dim >= 1,
          "--hidden-size, --num-attention-heads and --kv-channels must be >= 1");
  require(kv_heads >= 1 && heads % kv_heads == 0,
          "--num-query-groups must divide --num-attention-heads (got " + std::to_string(kv_heads) + " for " +
              std::to_string(heads) + " heads)");
  require(ffn_hidden >= 1, "--ffn-hidden-size must be >= 1");
  require(vocab_size >= 2, "vocabulary size must be >= 2");
  require(tensor_parallel_size >= 1 && heads % tensor_parallel_size == 0 &&
              kv_heads % tensor_parallel_size == 0 && ffn_hidden % tensor_parallel_size == 0 &&
              vocab_size % tensor_parallel_size == 0,
          "--tensor-model-parallel-size must divide heads, query groups, FFN size and padded vocabulary");
  require(position != PositionEmbedding::kRope || head_dim % 2 == 0,
          "RoPE needs an even head dimension (--kv-channels)");
  require(max_seq >= 1, "--seq-length must be >= 1");
}

std::string TransformerConfig::describe() const {
  std::ostringstream out;
  out << num_layers << "L h" << hidden << " heads " << heads << "/" << kv_heads << " d" << head_dim << " ffn "
      << ffn_hidden << " vocab " << vocab_size << (norm == NormKind::kRMSNorm ? " RMSNorm" : " LayerNorm")
      << (activation == ActivationKind::kSwiglu ? " SwiGLU" : " GELU")
      << (position == PositionEmbedding::kRope ? " RoPE" : " learned-pos")
      << (tied_embeddings ? " tied" : " untied") << (bias ? " bias" : " no-bias");
  return out.str();
}

}  // namespace megatune::executor
