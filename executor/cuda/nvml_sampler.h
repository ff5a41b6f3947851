// NvmlSampler: the SM clock and board power of one GPU through NVML, loaded at run time (dlopen of
// libnvidia-ml.so.1, so nothing links against the driver's library); -1 wherever NVML or a query is missing.
#pragma once
#include <string>

namespace megatune::executor::cuda {

class NvmlSampler {
 public:
  // pci_bus_id as cudaDeviceGetPCIBusId writes it ("0000:19:00.0").
  explicit NvmlSampler(const std::string& pci_bus_id);
  ~NvmlSampler();
  NvmlSampler(const NvmlSampler&) = delete;
  NvmlSampler& operator=(const NvmlSampler&) = delete;
  double sm_clock_mhz() const;  // current SM clock
  double power_w() const;       // current board power draw

 private:
  using GetClock = int (*)(void* device, int clock_type, unsigned* mhz);
  using GetPower = int (*)(void* device, unsigned* milliwatts);
  void* library_ = nullptr;
  void* device_ = nullptr;
  GetClock get_clock_ = nullptr;
  GetPower get_power_ = nullptr;
};

}  // namespace megatune::executor::cuda
