// TestRank: one rank of a test on threads as ranks: a CPU backend with an arena and its ThreadCommunicator,
// with host upload / download helpers.
#pragma once
#include <vector>

#include "executor/cpu/thread_communicator.h"
#include "layouts/rank_grid.h"

namespace megatune::executor {

struct TestRank {
  TestRank(const layouts::RankGrid& grid, int rank, ThreadWorld& world, bool bf16 = false)
      : backend(bf16), comm((backend.reserve_arena(1 << 22), backend), world, ProcessGroups(grid, rank)) {}
  // A (rows, cols) tensor holding `values` (left as allocated when empty).
  Tensor make(std::int64_t rows, std::int64_t cols, const std::vector<float>& values,
              DType dtype = DType::kFP32) {
    Tensor t = backend.allocate(dtype, rows, cols, "test");
    if (!values.empty()) backend.upload(t, values.data());
    return t;
  }
  Tensor make(const std::vector<float>& values) {
    return make(1, static_cast<std::int64_t>(values.size()), values);
  }
  std::vector<float> read(Tensor t) {
    std::vector<float> v(t.numel());
    backend.download(t, v.data());
    return v;
  }
  CpuBackend backend;
  ThreadCommunicator comm;
};

}  // namespace megatune::executor
