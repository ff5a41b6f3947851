// MoeIndexCache: the device copies of the MoE layers' permutation plans (row_token, token_rows,
// token_probs), one per plan object, each uploaded in one H2D copy from pinned staging when its contents
// change (the forward's permute after routing) and reused by the layer's combine, the combine's backward and
// the permutation's backward; plus the device and pinned buffers the combine's backward returns its
// probability gradients through.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "executor/backend/backend.h"

namespace megatune::executor::cuda {

struct DeviceMoePlan {
  const std::int32_t* row_token = nullptr;   // (R)
  const std::int32_t* token_rows = nullptr;  // (T, k)
  const float* token_probs = nullptr;        // (T, k)
  float* d_probs = nullptr;                  // (T, k) device scratch for the combine's backward
};

class MoeIndexCache {
 public:
  MoeIndexCache();
  ~MoeIndexCache();
  MoeIndexCache(const MoeIndexCache&) = delete;
  MoeIndexCache& operator=(const MoeIndexCache&) = delete;

  // The device copy of `plan`, uploaded on `stream` when this plan object was never seen or its contents
  // differ from the last upload (a host compare of a few hundred KiB at most). Buffers are allocated when a
  // plan object is first seen or outgrows them (the first steps), never in steady state.
  DeviceMoePlan get(const MoePermutation& plan, cudaStream_t stream);
  // d_probs (T * k) of `plan` (after moe_unpermute_backward wrote them on `stream`) into `out`; waits for
  // the stream (the host router's backward reads them).
  void download_d_probs(const MoePermutation& plan, cudaStream_t stream, std::vector<float>& out);

  std::int64_t uploads() const { return uploads_; }  // H2D copies issued so far
  std::int64_t device_bytes() const { return device_bytes_; }

 private:
  struct Entry;
  Entry& entry_for(const MoePermutation& plan, cudaStream_t stream);
  std::map<const MoePermutation*, std::unique_ptr<Entry>> entries_;
  std::int64_t uploads_ = 0;
  std::int64_t device_bytes_ = 0;
};

}  // namespace megatune::executor::cuda
