// The traced-run format (`megatune train --trace-dir DIR`, read by `megatune compare --run DIR`), version 1.
// Its one home: the executor writes it (executor/training/run_trace.h), the planner reads it
// (calibration/measured_run.h). Every file is written to a temporary name and renamed into place.
//
// DIR/run.json (written last, when every rank's file is in place: its presence marks a complete run):
//   {"format": "megatune-run-trace", "version": 1, "created_utc": "2026-12-01T09:00:00Z",
//    "megatune_commit": "653b93d1a2b4",           the build's git commit (+ "-dirty"); absent in older traces
//    "command": ["megatune", "train", ...],      the whole command line
//    "model_args": ["--model", "tiny", ...],     the model / parallel / batch flags (Megatron names), enough
//    to
//                                                rebuild the (model, layout) that compare simulates
//    "model": "tiny", "parameters": N, "layout": "tp1 pp1 dp1 cp1 vpp1 layout Et*2L", "world_size": 1,
//    "micro_batch_size": 2, "global_batch_size": 4, "num_microbatches": 2, "seq_length": 64,
//    "model_flops_per_iteration": F,             Megatron's formula, recomputation not counted
//    "device": "cpu" | "cuda", "backend": "cpu (bf16 emulated)", "gpu": "NVIDIA H200" | "",
//    "peak_tflops": 989.4 | 0,                   per GPU; 0: no MFU (CPU)
//    "cluster": "1x1xH200",                      the cluster compare simulates by default
//    "timing": "...",                            how op times were taken (host clock / CUDA events)
//    "trace_first_iteration": 2, "trace_iterations": 3,
//    "ranks": [{"rank": 0, "file": "rank_0.ops.jsonl"}, ...]}
//
// DIR/rank_<r>.ops.jsonl: one JSON object per line, "record" says which:
//   {"record": "rank", "version": 1, "rank": r, "tp": .., "pp": .., "dp": .., "cp": ..,
//    "arena_capacity_bytes": .., "arena_used_bytes": .., "device_memory_used_bytes": .. | -1,
//    "arena": [{"what": "weights", "bytes": .., "allocations": ..}, ...]}           first line
//   {"record": "iteration", "iteration": i, "step_s": .., "loss": .., "ops": n,
//    "sm_clock_mhz": .., "power_w": ..}   per traced iteration; SM clock and board power right after the step
//                                           (CUDA: NVML, when libnvidia-ml is there), else -1
//   {"record": "op", "iteration": i, "id": j, "stream": "compute" | "communication",
//    "start_s": .., "end_s": .., <op fields: see write_op_trace_fields>, "op": "<layouts::to_string>"}
// Op times are seconds after the iteration's first op began. `id` is the op's index in the iteration's
// issue order, which is its index in layouts::build_step_program(model, layout, r).ops: the join key with the
// simulator. -1 means "not available" for clocks, power and device memory.
#pragma once
#include <ostream>
#include <string>

#include "layouts/op.h"

namespace megatune::layouts {

inline constexpr const char* kRunTraceFormat = "megatune-run-trace";
inline constexpr int kRunTraceVersion = 1;
inline constexpr const char* kRunTraceManifest = "run.json";
// "rank_<r>.ops.jsonl"
std::string run_trace_rank_file(int rank);

// The op's identity as `"kind": .., "phase": .., "dtype": .., "label": .., "layer": .., "microbatch": ..,
// "chunk": .., "m": .., "n": .., "k": .., "accumulate": .., "bytes": .., "group": .., "group_size": ..,
// "peer": .., "attention": [batch, heads, kv_heads, seq_q, seq_kv, head_dim, causal]` (names as op.h's
// *_name functions spell them), without braces.
void write_op_trace_fields(std::ostream& out, const Op& op);

}  // namespace megatune::layouts
