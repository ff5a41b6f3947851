// TP communication overlapped with the neighbouring GEMMs, chunked over the TP group.
#include "planner/tp_comm_overlap.h"

#include <algorithm>

namespace megatune::planner {
namespace {

bool is_tp_collective(const layouts::Op& op) {
  return op.role == layouts::OpRole::kTensorParallel &&
         (op.kind == layouts::OpKind::kAllGather || op.kind == layouts::OpKind::kReduceScatter);
}

// The nearest GEMM from `from` in direction `step` (+1 after, -1 before) with no communication between;
// -1 when there is none.
int neighbouring_gemm(const std::vector<layouts::Op>& ops, int from, int step) {
  for (int i = from + step; i >= 0 && i < static_cast<int>(ops.size()); i += step) {
    if (ops[i].kind == layouts::OpKind::kGemm) return i;
    if (ops[i].is_communication()) return -1;
  }
  return -1;
}

}  // namespace

double tp_overlap_exposed_s(double comm_s, double gemm_s, int tp) {
  if (tp <= 1) return comm_s;
  const double pair_s = std::max(gemm_s, comm_s) + std::min(gemm_s, comm_s) / tp;
  return std::max(0.0, pair_s - gemm_s);
}

std::vector<double> tp_overlapped_times_s(const std::vector<layouts::Op>& ops,
                                          const std::vector<double>& times_s, int tp) {
  std::vector<double> kept = times_s;
  if (tp <= 1) return kept;
  std::vector<bool> gemm_used(ops.size(), false);
  for (int i = 0; i < static_cast<int>(ops.size()); ++i) {
    if (!is_tp_collective(ops[i])) continue;
    const int step = ops[i].kind == layouts::OpKind::kAllGather ? +1 : -1;
    const int gemm = neighbouring_gemm(ops, i, step);
    if (gemm < 0 || gemm_used[gemm]) continue;
    gemm_used[gemm] = true;
    kept[i] = tp_overlap_exposed_s(times_s[i], times_s[gemm], tp);
  }
  return kept;
}

}  // namespace megatune::planner
