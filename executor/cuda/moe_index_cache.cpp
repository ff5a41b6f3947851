// MoeIndexCache: per-plan device copies of the MoE permutation indices, uploaded from pinned staging.
#include "executor/cuda/moe_index_cache.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "executor/cuda/cuda_check.h"

namespace megatune::executor::cuda {
namespace {

// Regions of an entry's buffers, in 4-byte elements, each starting on a 256-byte boundary.
struct Regions {
  std::size_t row_token = 0, token_rows = 0, token_probs = 0, d_probs = 0, total = 0;
};

std::size_t aligned(std::size_t elements) { return (elements + 63) / 64 * 64; }

Regions regions_of(std::size_t rows, std::size_t pairs) {
  Regions r;
  r.token_rows = aligned(rows);
  r.token_probs = r.token_rows + aligned(pairs);
  r.d_probs = r.token_probs + aligned(pairs);
  r.total = r.d_probs + aligned(pairs);
  return r;
}

}  // namespace

struct MoeIndexCache::Entry {
  std::vector<std::int32_t> row_token, token_rows;  // the contents of the last upload
  std::vector<float> token_probs;
  Regions regions;
  std::size_t capacity = 0;  // 4-byte elements of both buffers
  char* device = nullptr;
  char* pinned = nullptr;
  cudaEvent_t uploaded = nullptr;  // after the last H2D copy out of `pinned`
  bool valid = false;

  ~Entry() {
    if (uploaded) cudaEventDestroy(uploaded);
    if (pinned) cudaFreeHost(pinned);
    if (device) cudaFree(device);
  }
  template <typename T>
  T* device_at(std::size_t offset) const {
    return reinterpret_cast<T*>(device + 4 * offset);
  }
  template <typename T>
  T* pinned_at(std::size_t offset) const {
    return reinterpret_cast<T*>(pinned + 4 * offset);
  }
  bool holds(const MoePermutation& plan) const {
    return valid && row_token == plan.row_token && token_rows == plan.token_rows &&
           token_probs == plan.token_probs;
  }
};

MoeIndexCache::MoeIndexCache() = default;
MoeIndexCache::~MoeIndexCache() = default;

MoeIndexCache::Entry& MoeIndexCache::entry_for(const MoePermutation& plan, cudaStream_t stream) {
  std::unique_ptr<Entry>& slot = entries_[&plan];
  if (!slot) {
    slot = std::make_unique<Entry>();
    MEGATUNE_CUDA_CHECK(cudaEventCreateWithFlags(&slot->uploaded, cudaEventDisableTiming));
  }
  Entry& e = *slot;
  if (e.holds(plan)) return e;
  if (plan.token_rows.size() != static_cast<std::size_t>(plan.tokens * plan.topk) ||
      plan.token_probs.size() != plan.token_rows.size())
    throw std::logic_error("MoE plan: token_rows and token_probs must hold tokens * topk entries");
  const Regions regions = regions_of(plan.row_token.size(), plan.token_rows.size());
  MEGATUNE_CUDA_CHECK(cudaEventSynchronize(e.uploaded));  // the pinned staging is free again
  if (regions.total > e.capacity) {
    // cudaFree waits for the device, so no queued kernel still reads the old buffer.
    if (e.device) MEGATUNE_CUDA_CHECK(cudaFree(e.device));
    if (e.pinned) MEGATUNE_CUDA_CHECK(cudaFreeHost(e.pinned));
    e.device = e.pinned = nullptr;
    device_bytes_ -= static_cast<std::int64_t>(4 * e.capacity);
    e.capacity = std::max(regions.total, e.capacity * 5 / 4);
    MEGATUNE_CUDA_CHECK(cudaMalloc(&e.device, 4 * e.capacity));
    MEGATUNE_CUDA_CHECK(cudaMallocHost(&e.pinned, 4 * e.capacity));
    device_bytes_ += static_cast<std::int64_t>(4 * e.capacity);
  }
  e.regions = regions;
  std::copy(plan.row_token.begin(), plan.row_token.end(), e.pinned_at<std::int32_t>(regions.row_token));
  std::copy(plan.token_rows.begin(), plan.token_rows.end(), e.pinned_at<std::int32_t>(regions.token_rows));
  std::copy(plan.token_probs.begin(), plan.token_probs.end(), e.pinned_at<float>(regions.token_probs));
  MEGATUNE_CUDA_CHECK(
      cudaMemcpyAsync(e.device, e.pinned, 4 * regions.d_probs, cudaMemcpyHostToDevice, stream));
  MEGATUNE_CUDA_CHECK(cudaEventRecord(e.uploaded, stream));
  ++uploads_;
  e.row_token = plan.row_token;
  e.token_rows = plan.token_rows;
  e.token_probs = plan.token_probs;
  e.valid = true;
  return e;
}

DeviceMoePlan MoeIndexCache::get(const MoePermutation& plan, cudaStream_t stream) {
  const Entry& e = entry_for(plan, stream);
  DeviceMoePlan d;
  d.row_token = e.device_at<const std::int32_t>(e.regions.row_token);
  d.token_rows = e.device_at<const std::int32_t>(e.regions.token_rows);
  d.token_probs = e.device_at<const float>(e.regions.token_probs);
  d.d_probs = e.device_at<float>(e.regions.d_probs);
  return d;
}

void MoeIndexCache::download_d_probs(const MoePermutation& plan, cudaStream_t stream,
                                     std::vector<float>& out) {
  const Entry& e = entry_for(plan, stream);
  const std::size_t pairs = plan.token_rows.size();
  float* staged = e.pinned_at<float>(e.regions.d_probs);
  MEGATUNE_CUDA_CHECK(cudaMemcpyAsync(staged, e.device_at<float>(e.regions.d_probs), 4 * pairs,
                                      cudaMemcpyDeviceToHost, stream));
  MEGATUNE_CUDA_CHECK(cudaStreamSynchronize(stream));
  out.assign(staged, staged + pairs);
}

}  // namespace megatune::executor::cuda
