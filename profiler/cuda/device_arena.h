// DeviceArena: one device allocation reused by every benchmark, grown (never shrunk) to the largest
// request; buffers are carved from it 256-byte aligned, so a sweep allocates only when a larger item comes.
#pragma once
#include <cstddef>
#include <cstdint>

namespace megatune::profiler::cuda {

class DeviceArena {
 public:
  DeviceArena() = default;
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // Starts a new layout of at most `total_bytes` (sum of the take() sizes, each rounded up to 256): grows
  // the allocation when needed (pointers of the previous layout become invalid).
  void begin(std::size_t total_bytes);
  // The next `bytes` of the current layout; throws std::logic_error past the size given to begin().
  void* take(std::size_t bytes);
  template <typename T>
  T* take(std::int64_t count) {
    return static_cast<T*>(take(static_cast<std::size_t>(count) * sizeof(T)));
  }
  static std::size_t rounded(std::size_t bytes) { return (bytes + 255) / 256 * 256; }
  std::size_t capacity_bytes() const { return capacity_; }

 private:
  void* base_ = nullptr;
  std::size_t capacity_ = 0;
  std::size_t limit_ = 0;
  std::size_t offset_ = 0;
};

}  // namespace megatune::profiler::cuda
