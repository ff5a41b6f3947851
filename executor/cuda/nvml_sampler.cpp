// NvmlSampler: four NVML entry points looked up with dlsym (C API, stable across driver versions).
#include "executor/cuda/nvml_sampler.h"

#include <dlfcn.h>

namespace megatune::executor::cuda {
namespace {
constexpr int kNvmlSuccess = 0;
constexpr int kNvmlClockSm = 1;  // NVML_CLOCK_SM
}  // namespace

NvmlSampler::NvmlSampler(const std::string& pci_bus_id) {
  library_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library_ == nullptr) return;
  using Init = int (*)();
  using ByBusId = int (*)(const char*, void**);
  auto init = reinterpret_cast<Init>(dlsym(library_, "nvmlInit_v2"));
  auto by_bus_id = reinterpret_cast<ByBusId>(dlsym(library_, "nvmlDeviceGetHandleByPciBusId_v2"));
  get_clock_ = reinterpret_cast<GetClock>(dlsym(library_, "nvmlDeviceGetClockInfo"));
  get_power_ = reinterpret_cast<GetPower>(dlsym(library_, "nvmlDeviceGetPowerUsage"));
  if (init == nullptr || by_bus_id == nullptr || init() != kNvmlSuccess ||
      by_bus_id(pci_bus_id.c_str(), &device_) != kNvmlSuccess)
    device_ = nullptr;
}

NvmlSampler::~NvmlSampler() {
  if (library_ == nullptr) return;
  using Shutdown = int (*)();
  if (device_ != nullptr)
    if (auto shutdown = reinterpret_cast<Shutdown>(dlsym(library_, "nvmlShutdown"))) shutdown();
  dlclose(library_);
}

double NvmlSampler::sm_clock_mhz() const {
  unsigned mhz = 0;
  if (device_ == nullptr || get_clock_ == nullptr || get_clock_(device_, kNvmlClockSm, &mhz) != kNvmlSuccess)
    return -1.0;
  return mhz;
}

double NvmlSampler::power_w() const {
  unsigned milliwatts = 0;
  if (device_ == nullptr || get_power_ == nullptr || get_power_(device_, &milliwatts) != kNvmlSuccess)
    return -1.0;
  return milliwatts * 1e-3;
}

}  // namespace megatune::executor::cuda
