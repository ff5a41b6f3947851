// Megatron's --tp-comm-overlap (Transformer Engine's userbuffers): with sequence parallelism, a TP
// all-gather is split into tp chunks that feed the column-parallel GEMM after it chunk by chunk, and a TP
// reduce-scatter drains the row-parallel GEMM before it chunk by chunk. The pair then takes
// max(gemm, comm) + min(gemm, comm) / tp: only the part of the communication that does not hide behind its
// GEMM is exposed.
#pragma once
#include <vector>

#include "layouts/op.h"

namespace megatune::planner {

// The time each op of `ops` (one pass, in issue order) keeps on its stream when TP communication overlaps
// the neighbouring GEMMs: `times_s[i]` for every op but the TP all-gathers (paired with the nearest GEMM
// after them) and reduce-scatters (paired with the nearest GEMM before them; no communication between),
// which keep only their exposed part. Each GEMM hides at most one collective. tp <= 1 changes nothing.
std::vector<double> tp_overlapped_times_s(const std::vector<layouts::Op>& ops,
                                          const std::vector<double>& times_s, int tp);

// The exposed part of a collective of `comm_s` chunked over `tp` ranks against a GEMM of `gemm_s`.
double tp_overlap_exposed_s(double comm_s, double gemm_s, int tp);

}  // namespace megatune::planner
