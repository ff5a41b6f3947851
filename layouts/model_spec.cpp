// ModelSpec: resolved defaults, validation, MoE layer patterns and parameter counts.
#include "layouts/model_spec.h"

#include <cctype>
#include <cmath>
#include <string>

#include "base/user_error.h"

namespace megatune::layouts {

std::string_view to_string(Normalization normalization) {
  return normalization == Normalization::kLayerNorm ? "LayerNorm" : "RMSNorm";
}
std::string_view to_string(Activation activation) {
  return activation == Activation::kGelu ? "gelu" : "swiglu";
}
std::string_view to_string(PositionEmbedding position_embedding) {
  return position_embedding == PositionEmbedding::kLearnedAbsolute ? "learned_absolute" : "rope";
}

int ModelSpec::ffn_size() const {
  if (ffn_hidden_size > 0) return ffn_hidden_size;
  // Megatron's arguments.py default.
  if (activation == Activation::kSwiglu) return static_cast<int>((4.0 * hidden_size * 2.0 / 3.0) / 64.0) * 64;
  return 4 * hidden_size;
}
int ModelSpec::query_groups() const { return num_query_groups > 0 ? num_query_groups : num_attention_heads; }
int ModelSpec::head_dim() const {
  if (kv_channels > 0) return kv_channels;
  return num_attention_heads > 0 ? hidden_size / num_attention_heads : 0;
}
int ModelSpec::moe_ffn_size() const { return moe_ffn_hidden_size > 0 ? moe_ffn_hidden_size : ffn_size(); }
int ModelSpec::max_positions() const {
  return max_position_embeddings > 0 ? max_position_embeddings : seq_length;
}

bool ModelSpec::is_moe_layer(int layer_index) const {
  if (num_experts <= 0 || layer_index < 0) return false;
  if (!moe_layer_pattern.empty()) {
    return layer_index < static_cast<int>(moe_layer_pattern.size()) && moe_layer_pattern[layer_index] != 0;
  }
  return moe_layer_freq > 0 && layer_index % moe_layer_freq == 0;
}

int ModelSpec::num_moe_layers() const {
  int count = 0;
  for (int i = 0; i < num_layers; ++i) count += is_moe_layer(i) ? 1 : 0;
  return count;
}

bool ModelSpec::mtp_layer_is_moe() const { return is_moe_layer(num_layers - 1); }

int64_t ModelSpec::padded_vocab_size(int tensor_parallel_size) const {
  const int64_t multiple =
      static_cast<int64_t>(make_vocab_size_divisible_by > 0 ? make_vocab_size_divisible_by : 1) *
      (tensor_parallel_size > 0 ? tensor_parallel_size : 1);
  return (static_cast<int64_t>(vocab_size) + multiple - 1) / multiple * multiple;
}

namespace {

void require_positive(int value, const char* flag) {
  if (value <= 0) {
    throw UserError(std::string(flag) + " " + std::to_string(value) + " must be a positive integer: pass " +
                    flag + " N with N >= 1 (or pick a model with --model)");
  }
}

constexpr int kMaxDimension = 1 << 24;  // keeps every product in 64-bit arithmetic

void require_sane(int value, const char* flag) {
  if (value > kMaxDimension) {
    throw UserError(std::string(flag) + " " + std::to_string(value) + " is larger than " +
                    std::to_string(kMaxDimension) + ": pass a realistic value");
  }
}

}  // namespace

void ModelSpec::validate() const {
  require_positive(num_layers, "--num-layers");
  require_positive(hidden_size, "--hidden-size");
  require_positive(num_attention_heads, "--num-attention-heads");
  require_positive(seq_length, "--seq-length");
  require_positive(vocab_size, "--vocab-size");
  const std::pair<int, const char*> fields[] = {
      {num_layers, "--num-layers"},
      {hidden_size, "--hidden-size"},
      {ffn_hidden_size, "--ffn-hidden-size"},
      {num_attention_heads, "--num-attention-heads"},
      {num_query_groups, "--num-query-groups"},
      {kv_channels, "--kv-channels"},
      {seq_length, "--seq-length"},
      {max_position_embeddings, "--max-position-embeddings"},
      {vocab_size, "--vocab-size"},
      {num_experts, "--num-experts"},
      {moe_ffn_hidden_size, "--moe-ffn-hidden-size"},
      {moe_shared_expert_intermediate_size, "--moe-shared-expert-intermediate-size"},
      {mtp_num_layers, "--mtp-num-layers"},
      {q_lora_rank, "--q-lora-rank"},
      {kv_lora_rank, "--kv-lora-rank"},
      {qk_head_dim, "--qk-head-dim"},
      {qk_pos_emb_head_dim, "--qk-pos-emb-head-dim"},
      {v_head_dim, "--v-head-dim"},
      {make_vocab_size_divisible_by, "--make-vocab-size-divisible-by"}};
  for (const auto& [value, flag] : fields) {
    require_sane(value, flag);
    if (value < 0) {
      throw UserError(std::string(flag) + " " + std::to_string(value) + " is negative: pass a value >= 0");
    }
  }
  require_positive(make_vocab_size_divisible_by, "--make-vocab-size-divisible-by");
  if (ffn_hidden_size == 0 && ffn_size() <= 0) {
    throw UserError("--hidden-size " + std::to_string(hidden_size) +
                    " gives no default --ffn-hidden-size: pass --ffn-hidden-size");
  }
  if (kv_channels == 0 && !multi_latent_attention && hidden_size % num_attention_heads != 0) {
    throw UserError("--hidden-size " + std::to_string(hidden_size) +
                    " is not divisible by --num-attention-heads " + std::to_string(num_attention_heads) +
                    ": pass --kv-channels (head dim) or change either");
  }
  if (num_query_groups > 0 && num_attention_heads % num_query_groups != 0) {
    throw UserError("--num-query-groups " + std::to_string(num_query_groups) +
                    " does not divide --num-attention-heads " + std::to_string(num_attention_heads) +
                    ": use a divisor of the head count");
  }
  if (max_position_embeddings > 0 && position_embedding == PositionEmbedding::kLearnedAbsolute &&
      max_position_embeddings < seq_length) {
    throw UserError("--max-position-embeddings " + std::to_string(max_position_embeddings) +
                    " is below --seq-length " + std::to_string(seq_length) +
                    ": raise --max-position-embeddings to at least the sequence length");
  }
  if (multi_latent_attention) {
    require_positive(kv_lora_rank, "--kv-lora-rank");
    require_positive(qk_head_dim, "--qk-head-dim");
    require_positive(qk_pos_emb_head_dim, "--qk-pos-emb-head-dim");
    require_positive(v_head_dim, "--v-head-dim");
    if (!(std::isfinite(rotary_scaling_factor) && rotary_scaling_factor > 0))
      throw UserError("--rotary-scaling-factor " + std::to_string(rotary_scaling_factor) +
                      " makes no sense: give a finite factor > 0 (1: plain RoPE; DeepSeek-V3: 40)");
    if (!std::isfinite(mscale) || !std::isfinite(mscale_all_dim))
      throw UserError("--mscale and --mscale-all-dim must be finite numbers (DeepSeek-V3: 1.0 and 1.0)");
  }
  if (num_experts > 0) {
    require_positive(moe_router_topk, "--moe-router-topk");
    if (moe_router_topk > num_experts) {
      throw UserError("--moe-router-topk " + std::to_string(moe_router_topk) + " exceeds --num-experts " +
                      std::to_string(num_experts) + ": route to at most num-experts experts");
    }
    if (moe_layer_pattern.empty()) {
      require_positive(moe_layer_freq, "--moe-layer-freq");
    } else {
      if (static_cast<int>(moe_layer_pattern.size()) != num_layers) {
        throw UserError("--moe-layer-freq lists " + std::to_string(moe_layer_pattern.size()) +
                        " layers but --num-layers is " + std::to_string(num_layers) +
                        ": give exactly one 0/1 entry per decoder layer");
      }
      for (int entry : moe_layer_pattern) {
        if (entry != 0 && entry != 1) {
          throw UserError("--moe-layer-freq pattern holds " + std::to_string(entry) +
                          ": entries must be 0 (dense) or 1 (MoE)");
        }
      }
    }
  } else {
    if (moe_shared_expert_intermediate_size > 0 || moe_ffn_hidden_size > 0) {
      throw UserError(
          "--moe-ffn-hidden-size / --moe-shared-expert-intermediate-size need --num-experts: pass "
          "--num-experts N");
    }
  }
}

int64_t norm_parameters(const ModelSpec& m) {
  return m.normalization == Normalization::kLayerNorm ? 2LL * m.hidden_size : m.hidden_size;
}

int64_t qk_norm_parameters(const ModelSpec& m) {
  if (!m.qk_layernorm || m.multi_latent_attention) return 0;
  return (m.normalization == Normalization::kLayerNorm ? 4LL : 2LL) * m.head_dim();
}

int64_t mlp_parameters(const ModelSpec& m, int64_t ffn, int tp) {
  const int64_t h = m.hidden_size;
  const int64_t glu = m.activation == Activation::kSwiglu ? 2 : 1;
  int64_t params = (glu + 1) * h * ffn / tp;
  if (m.add_bias_linear) params += glu * ffn / tp + h;
  return params;
}

int64_t attention_parameters(const ModelSpec& m, int tp) {
  const int64_t h = m.hidden_size;
  const int64_t n_h = m.num_attention_heads;
  int64_t params = norm_parameters(m);  // input norm
  if (m.multi_latent_attention) {
    const int64_t qk = m.qk_head_dim + m.qk_pos_emb_head_dim;
    const int64_t latent_norm = m.normalization == Normalization::kLayerNorm ? 2 : 1;  // per latent feature
    if (m.q_lora_rank > 0) {
      params += h * m.q_lora_rank + latent_norm * m.q_lora_rank /* q norm */ + m.q_lora_rank * n_h * qk / tp;
    } else {
      params += h * n_h * qk / tp;
    }
    params += h * (m.kv_lora_rank + m.qk_pos_emb_head_dim) + latent_norm * m.kv_lora_rank /* kv norm */ +
              m.kv_lora_rank * n_h * (m.qk_head_dim + m.v_head_dim) / tp;
    params += n_h * m.v_head_dim / tp * h;
    if (m.add_bias_linear) params += h;
    return params;
  }
  const int64_t q = int64_t{m.head_dim()} * n_h;
  const int64_t kv = int64_t{m.head_dim()} * m.query_groups();
  params += h * ((q + 2 * kv) / tp) + q / tp * h + qk_norm_parameters(m);
  if (m.add_bias_linear) params += (q + 2 * kv) / tp + h;
  return params;
}

int64_t decoder_mlp_parameters(const ModelSpec& m, bool moe, int tp) {
  if (!moe) return norm_parameters(m) + mlp_parameters(m, m.ffn_size(), tp);
  const int64_t shared = m.moe_shared_expert_intermediate_size;
  return norm_parameters(m) + int64_t{m.hidden_size} * m.num_experts +
         (shared > 0 ? mlp_parameters(m, shared, tp) : 0);
}

int64_t routed_expert_parameters(const ModelSpec& m, int experts, int etp) {
  return experts * mlp_parameters(m, m.moe_ffn_size(), etp);
}

int64_t mtp_extra_parameters(const ModelSpec& m, int tp) {
  return 3 * norm_parameters(m) + 2LL * m.hidden_size * m.hidden_size / tp;
}

ParameterCounts ModelSpec::parameter_counts(int tensor_parallel_size) const {
  ParameterCounts c;
  const int64_t h = hidden_size;
  const int64_t vocab = padded_vocab_size(tensor_parallel_size);
  c.word_embedding = vocab * h;
  c.position_embedding =
      position_embedding == PositionEmbedding::kLearnedAbsolute ? int64_t{max_positions()} * h : 0;
  c.output_layer = untie_embeddings_and_output_weights ? vocab * h : 0;
  c.final_norm = norm_parameters(*this);
  c.attention_per_layer = attention_parameters(*this);
  c.dense_mlp_per_layer = decoder_mlp_parameters(*this, false);
  if (num_experts > 0) {
    const int64_t dense_part = decoder_mlp_parameters(*this, true);  // pre-MLP norm, router, shared expert
    c.moe_mlp_per_layer = dense_part + routed_expert_parameters(*this, num_experts);
    c.moe_mlp_active_per_layer = dense_part + routed_expert_parameters(*this, moe_router_topk);
  }
  c.num_moe_layers = num_moe_layers();
  c.num_dense_layers = num_layers - c.num_moe_layers;
  c.decoder_layers = int64_t{num_layers} * c.attention_per_layer +
                     int64_t{c.num_dense_layers} * c.dense_mlp_per_layer +
                     int64_t{c.num_moe_layers} * c.moe_mlp_per_layer;
  const bool last_is_moe = mtp_layer_is_moe();
  const int64_t mtp_layer_mlp = last_is_moe ? c.moe_mlp_per_layer : c.dense_mlp_per_layer;
  const int64_t mtp_layer_mlp_active = last_is_moe ? c.moe_mlp_active_per_layer : c.dense_mlp_per_layer;
  // enorm + hnorm + eh_proj (2h -> h, no bias) + transformer layer + final norm.
  c.mtp_per_layer = mtp_extra_parameters(*this) + c.attention_per_layer + mtp_layer_mlp;
  c.mtp = int64_t{mtp_num_layers} * c.mtp_per_layer;
  c.total =
      c.word_embedding + c.position_embedding + c.output_layer + c.final_norm + c.decoder_layers + c.mtp;
  // Active per token: everything except the routed experts a token does not visit.
  const int64_t active_layers = int64_t{num_layers} * c.attention_per_layer +
                                int64_t{c.num_dense_layers} * c.dense_mlp_per_layer +
                                int64_t{c.num_moe_layers} * c.moe_mlp_active_per_layer;
  const int64_t active_mtp =
      int64_t{mtp_num_layers} * (c.mtp_per_layer - mtp_layer_mlp + mtp_layer_mlp_active);
  c.active_per_token =
      c.word_embedding + c.position_embedding + c.output_layer + c.final_norm + active_layers + active_mtp;
  return c;
}

namespace {

std::string strip_spaces(std::string_view text) {
  std::string out;
  for (char ch : text) {
    if (!std::isspace(static_cast<unsigned char>(ch))) out.push_back(ch);
  }
  return out;
}

[[noreturn]] void bad_moe_freq(std::string_view text, const std::string& why) {
  throw UserError("--moe-layer-freq '" + std::string(text) + "' " + why +
                  ": pass an integer k (every k-th layer is MoE), a list like [0,1,1,1] or Megatron's form "
                  "([0]*3+[1]*58)");
}

int parse_small_int(std::string_view digits, std::string_view whole) {
  if (digits.empty() || digits.size() > 7) bad_moe_freq(whole, "holds a bad number");
  int value = 0;
  for (char ch : digits) {
    if (ch < '0' || ch > '9') bad_moe_freq(whole, "holds a bad number");
    value = value * 10 + (ch - '0');
  }
  return value;
}

}  // namespace

std::vector<int> parse_moe_layer_freq(std::string_view text, int num_layers) {
  std::string s = strip_spaces(text);
  if (s.empty()) bad_moe_freq(text, "is empty");
  if (num_layers <= 0 || num_layers > kMaxDimension) bad_moe_freq(text, "needs a positive --num-layers");
  std::vector<int> pattern;
  if (s[0] != '[' && s[0] != '(') {
    const int k = parse_small_int(s, text);
    if (k <= 0) bad_moe_freq(text, "must be >= 1");
    for (int i = 0; i < num_layers; ++i) pattern.push_back(i % k == 0 ? 1 : 0);
    return pattern;
  }
  if (s.front() == '(') {
    if (s.back() != ')') bad_moe_freq(text, "has unbalanced parentheses");
    s = s.substr(1, s.size() - 2);
  }
  // Terms "[a,b,...]" or "[a,b,...]*n" joined by '+'.
  size_t pos = 0;
  while (pos < s.size()) {
    if (s[pos] != '[') bad_moe_freq(text, "expects '[' at position " + std::to_string(pos));
    const size_t close = s.find(']', pos);
    if (close == std::string::npos) bad_moe_freq(text, "has no closing ']'");
    std::vector<int> term;
    std::string_view body(s.data() + pos + 1, close - pos - 1);
    size_t start = 0;
    while (start <= body.size()) {
      size_t comma = body.find(',', start);
      if (comma == std::string_view::npos) comma = body.size();
      term.push_back(parse_small_int(body.substr(start, comma - start), text));
      start = comma + 1;
    }
    pos = close + 1;
    int repeat = 1;
    if (pos < s.size() && s[pos] == '*') {
      size_t end = pos + 1;
      while (end < s.size() && std::isdigit(static_cast<unsigned char>(s[end]))) ++end;
      repeat = parse_small_int(std::string_view(s).substr(pos + 1, end - pos - 1), text);
      pos = end;
    }
    if (static_cast<int64_t>(pattern.size()) + static_cast<int64_t>(term.size()) * repeat > kMaxDimension) {
      bad_moe_freq(text, "is far longer than any model");
    }
    for (int r = 0; r < repeat; ++r) pattern.insert(pattern.end(), term.begin(), term.end());
    if (pos < s.size()) {
      if (s[pos] != '+') bad_moe_freq(text, "expects '+' at position " + std::to_string(pos));
      ++pos;
      if (pos == s.size()) bad_moe_freq(text, "ends with '+'");
    }
  }
  if (static_cast<int>(pattern.size()) != num_layers) {
    bad_moe_freq(text, "lists " + std::to_string(pattern.size()) + " layers but --num-layers is " +
                           std::to_string(num_layers));
  }
  for (int entry : pattern) {
    if (entry != 0 && entry != 1)
      bad_moe_freq(text, "holds " + std::to_string(entry) + " (entries are 0 or 1)");
  }
  return pattern;
}

}  // namespace megatune::layouts
