// Sweep items: their database keys and descriptions.
#include "profiler/sweep_items.h"

#include <cstdio>
#include <tuple>

namespace megatune::profiler {

const char* gemm_variant_name(GemmVariant variant) {
  switch (variant) {
    case GemmVariant::kForward:
      return "fwd";
    case GemmVariant::kBackwardData:
      return "dgrad";
    case GemmVariant::kBackwardWeight:
      return "wgrad";
  }
  return "?";
}

cost_models::KernelTiming kernel_timing_key(const GemmItem& item) {
  cost_models::KernelTiming row;
  row.op_kind = layouts::op_kind_name(layouts::OpKind::kGemm);
  row.m = item.m, row.n = item.n, row.k = item.k;
  row.dtype = cost_models::dtype_name(item.dtype);
  return row;
}

cost_models::KernelTiming kernel_timing_key(const AttentionItem& item) {
  cost_models::KernelTiming row;
  row.op_kind = layouts::op_kind_name(item.backward ? layouts::OpKind::kAttentionBackward
                                                    : layouts::OpKind::kAttentionForward);
  row.batch = item.shape.batch, row.heads = item.shape.heads, row.kv_heads = item.shape.kv_heads;
  row.seq_q = item.shape.seq_q, row.seq_kv = item.shape.seq_kv, row.head_dim = item.shape.head_dim;
  row.causal = item.shape.causal;
  row.dtype = cost_models::dtype_name(item.dtype);
  return row;
}

cost_models::KernelTiming kernel_timing_key(const MemoryBoundItem& item) {
  cost_models::KernelTiming row;
  row.op_kind = layouts::op_kind_name(item.kind);
  row.bytes = item.bytes;
  row.dtype = cost_models::dtype_name(item.dtype);
  return row;
}

cost_models::CollectiveTiming collective_timing_key(const CollectiveItem& item) {
  cost_models::CollectiveTiming row;
  row.op = cost_models::collective_op_name(item.op);
  row.group_size = item.group_size;
  row.placement = "intra";
  row.nodes = 1;
  row.bytes = item.bytes;
  return row;
}

bool same_kernel_key(const cost_models::KernelTiming& a, const cost_models::KernelTiming& b) {
  return std::tie(a.op_kind, a.m, a.n, a.k, a.batch, a.heads, a.kv_heads, a.seq_q, a.seq_kv, a.head_dim,
                  a.causal, a.bytes, a.dtype) == std::tie(b.op_kind, b.m, b.n, b.k, b.batch, b.heads,
                                                          b.kv_heads, b.seq_q, b.seq_kv, b.head_dim, b.causal,
                                                          b.bytes, b.dtype);
}

bool same_collective_key(const cost_models::CollectiveTiming& a, const cost_models::CollectiveTiming& b) {
  return std::tie(a.op, a.group_size, a.placement, a.nodes, a.bytes) ==
         std::tie(b.op, b.group_size, b.placement, b.nodes, b.bytes);
}

std::string format_bytes(std::int64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) value /= 1024.0, ++unit;
  char text[32];
  if (unit == 0) {
    std::snprintf(text, sizeof text, "%lld B", static_cast<long long>(bytes));
  } else {
    std::snprintf(text, sizeof text, "%.1f %s", value, kUnits[unit]);
  }
  return text;
}

std::string describe(const GemmItem& item) {
  return "gemm " + std::to_string(item.m) + "x" + std::to_string(item.n) + "x" + std::to_string(item.k) +
         " " + gemm_variant_name(item.variant) + " " + cost_models::dtype_name(item.dtype);
}

std::string describe(const AttentionItem& item) {
  const auto& s = item.shape;
  return std::string(item.backward ? "attention_bwd" : "attention_fwd") + " b=" + std::to_string(s.batch) +
         " h=" + std::to_string(s.heads) + "/" + std::to_string(s.kv_heads) +
         " s=" + std::to_string(s.seq_q) + (s.seq_kv != s.seq_q ? "x" + std::to_string(s.seq_kv) : "") +
         " d=" + std::to_string(s.head_dim) + (s.causal ? " causal" : "");
}

std::string describe(const MemoryBoundItem& item) {
  const std::string cast = item.is_fp8_cast()
                               ? std::string(" fp8 cast x") + std::to_string(item.cast_outputs) +
                                     (item.cast_current_scaling ? " current scaling" : "")
                               : "";
  return std::string(layouts::op_kind_name(item.kind)) + " " + format_bytes(item.bytes) +
         (item.columns > 0 ? " cols=" + std::to_string(item.columns) : "") + cast;
}

std::string describe(const CollectiveItem& item) {
  return std::string(cost_models::collective_op_name(item.op)) + " n=" + std::to_string(item.group_size) +
         " " + format_bytes(item.bytes);
}

}  // namespace megatune::profiler
