// Model FLOPs (Megatron's num_floating_point_operations), MFU and the GPU peak table.
#include "layouts/flops.h"

#include <cctype>
#include <string>

#include "layouts/user_error.h"

namespace megatune::layouts {

FlopsBreakdown model_flops_breakdown(const ModelSpec& model, int64_t global_batch_size,
                                     int tensor_model_parallel_size) {
  const double h = model.hidden_size;
  const double s = model.seq_length;
  const double tokens = static_cast<double>(global_batch_size) * s;                // T = B s
  const double tokens_times_seq = static_cast<double>(global_batch_size) * s * s;  // S2 = B s^2
  const double vocab = static_cast<double>(model.padded_vocab_size(tensor_model_parallel_size));
  const double gated = model.activation == Activation::kSwiglu ? 3.0 : 2.0;  // f
  const double mtp_layers = model.mtp_num_layers;

  double moe_layers = 0, dense_layers = 0;
  for (int i = 0; i < model.num_layers; ++i) (model.is_moe_layer(i) ? moe_layers : dense_layers) += 1;
  // MTP layers count as extra layers of the last layer's kind.
  (model.is_moe_layer(model.num_layers - 1) ? moe_layers : dense_layers) += mtp_layers;
  const double attention_layers = model.num_layers + mtp_layers;

  const double ffn = model.ffn_size();
  const double moe_ffn = model.is_moe() ? model.moe_ffn_size() : 0.0;
  const double topk = model.is_moe() ? model.moe_router_topk : 0.0;
  const double shared_ffn = model.moe_shared_expert_intermediate_size;

  double attention_linear_per_layer = 0, attention_core_per_layer = 0;
  const double heads = model.num_attention_heads;
  if (model.multi_latent_attention) {
    const double d_qk = model.qk_head_dim, d_rope = model.qk_pos_emb_head_dim, d_v = model.v_head_dim;
    const double r_q = model.q_lora_rank, r_kv = model.kv_lora_rank;
    const double q_term =
        model.q_lora_rank > 0 ? r_q * (h + heads * (d_qk + d_rope) + 1) : h * heads * (d_qk + d_rope);
    attention_linear_per_layer =
        6 * (q_term + r_kv * (h + heads * (d_qk + d_v) + 1) + h * d_rope + heads * d_v * h);
    attention_core_per_layer = 6 * (heads * (d_qk + d_rope) / 2 + heads * d_v / 2);
  } else {
    const double q = static_cast<double>(model.head_dim()) * heads;
    const double kv = static_cast<double>(model.head_dim()) * model.query_groups();
    attention_linear_per_layer = 6 * (h * (q + 2 * kv) + q * h);
    attention_core_per_layer = 6 * q;
  }

  FlopsBreakdown f;
  f.mlp = tokens * 6 * h *
          (ffn * gated * dense_layers + (moe_ffn * topk * gated + shared_ffn * gated) * moe_layers);
  f.attention_linear = tokens * attention_linear_per_layer * attention_layers;
  f.attention_core = tokens_times_seq * attention_core_per_layer * attention_layers;
  f.mtp = tokens * 6 * mtp_layers * (3 * h + 2 * h * h);
  f.logits = tokens * 6 * h * vocab * (mtp_layers + 1);
  f.total = f.mlp + f.attention_linear + f.attention_core + f.mtp + f.logits;
  return f;
}

double model_flops_per_iteration(const ModelSpec& model, int64_t global_batch_size,
                                 int tensor_model_parallel_size) {
  return model_flops_breakdown(model, global_batch_size, tensor_model_parallel_size).total;
}

double mfu(double flops, double step_time_s, int gpus, double peak_tflops_per_gpu) {
  if (step_time_s <= 0 || gpus <= 0 || peak_tflops_per_gpu <= 0) return 0.0;
  return flops / (step_time_s * gpus * peak_tflops_per_gpu * 1e12);
}

std::string_view to_string(PeakPrecision precision) {
  switch (precision) {
    case PeakPrecision::kFp32:
      return "fp32";
    case PeakPrecision::kTf32:
      return "tf32";
    case PeakPrecision::kBf16:
      return "bf16";
    case PeakPrecision::kFp16:
      return "fp16";
    case PeakPrecision::kFp8:
      return "fp8";
  }
  return "?";
}

PeakPrecision parse_peak_precision(std::string_view text) {
  std::string lower;
  for (char ch : text) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  for (PeakPrecision p : {PeakPrecision::kFp32, PeakPrecision::kTf32, PeakPrecision::kBf16,
                          PeakPrecision::kFp16, PeakPrecision::kFp8}) {
    if (lower == to_string(p)) return p;
  }
  throw UserError("precision '" + std::string(text) + "' is unknown: use fp32, tf32, bf16, fp16 or fp8");
}

namespace {

// Dense datasheet peaks in TFLOP/s (NVIDIA product briefs; sparsity figures halved). 0: not offered.
struct GpuPeak {
  const char* name;
  double fp32, tf32, bf16, fp16, fp8;
};
constexpr GpuPeak kPeaks[] = {
    {"H100 SXM", 66.9, 494.7, 989.4, 989.4, 1978.9}, {"H100 PCIe", 51.2, 378.0, 756.5, 756.5, 1513.0},
    {"H100 NVL", 60.0, 417.5, 835.5, 835.5, 1670.5}, {"H200", 66.9, 494.7, 989.4, 989.4, 1978.9},
    {"GH200", 66.9, 494.7, 989.4, 989.4, 1978.9},    {"A100", 19.5, 156.0, 312.0, 312.0, 0.0},
    {"B200", 75.0, 1125.0, 2250.0, 2250.0, 4500.0},  {"GB200", 80.0, 1250.0, 2500.0, 2500.0, 5000.0},
    {"L40S", 91.6, 183.0, 362.05, 362.05, 733.0},
};

std::string normalize(std::string_view text) {
  std::string out;
  for (char ch : text) {
    if (std::isalnum(static_cast<unsigned char>(ch)))
      out += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  }
  if (out.rfind("nvidia", 0) == 0) out.erase(0, 6);
  return out;
}

const GpuPeak* find_gpu(std::string_view gpu_name) {
  const std::string n = normalize(gpu_name);
  const auto has = [&](const char* token) { return n.find(token) != std::string::npos; };
  const auto by_name = [](const char* name) -> const GpuPeak* {
    for (const GpuPeak& peak : kPeaks) {
      if (std::string_view(peak.name) == name) return &peak;
    }
    return nullptr;
  };
  if (n.empty()) return nullptr;
  if (has("gh200")) return by_name("GH200");
  if (has("gb200")) return by_name("GB200");
  if (has("h200")) return by_name("H200");
  if (has("h100")) {
    if (has("pcie")) return by_name("H100 PCIe");
    if (has("nvl")) return by_name("H100 NVL");
    return by_name("H100 SXM");  // "H100", "H100 SXM5", "NVIDIA H100 80GB HBM3"
  }
  if (has("a100")) return by_name("A100");
  if (has("b200")) return by_name("B200");
  if (has("l40s")) return by_name("L40S");
  return nullptr;
}

}  // namespace

std::vector<std::string> known_gpu_names() {
  std::vector<std::string> names;
  for (const GpuPeak& peak : kPeaks) names.emplace_back(peak.name);
  return names;
}

double peak_dense_tflops(std::string_view gpu_name, PeakPrecision precision) {
  const GpuPeak* gpu = find_gpu(gpu_name);
  if (!gpu) {
    std::string known;
    for (const auto& name : known_gpu_names()) {
      known += known.empty() ? "" : ", ";
      known += name;
    }
    throw UserError("GPU '" + std::string(gpu_name) + "' has no peak FLOP/s entry: use one of " + known +
                    " (or give the peak explicitly)");
  }
  double value = 0;
  switch (precision) {
    case PeakPrecision::kFp32:
      value = gpu->fp32;
      break;
    case PeakPrecision::kTf32:
      value = gpu->tf32;
      break;
    case PeakPrecision::kBf16:
      value = gpu->bf16;
      break;
    case PeakPrecision::kFp16:
      value = gpu->fp16;
      break;
    case PeakPrecision::kFp8:
      value = gpu->fp8;
      break;
  }
  if (value <= 0) {
    throw UserError("GPU " + std::string(gpu->name) + " has no " + std::string(to_string(precision)) +
                    " tensor-core rate: use bf16, fp16 or tf32");
  }
  return value;
}

}  // namespace megatune::layouts
