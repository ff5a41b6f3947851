// Device identity: catalog GPU name and software versions.
#include "profiler/cuda/device_identity.h"

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <fstream>
#include <regex>
#include <sstream>

#include "cost_models/hardware_catalog.h"
#include "executor/cuda/cuda_check.h"
#include "git_commit.h"  // generated at build time (profiler/cuda/CMakeLists.txt)

#ifndef MEGATUNE_GIT_COMMIT
#define MEGATUNE_GIT_COMMIT "unknown"
#endif

namespace megatune::profiler::cuda {
namespace {

std::string driver_version() {
  std::ifstream in("/proc/driver/nvidia/version");
  std::string line;
  if (in && std::getline(in, line)) {
    std::smatch match;
    if (std::regex_search(line, match, std::regex(R"((\d+\.\d+(\.\d+)?))"))) return match[1].str();
  }
  int version = 0;
  MEGATUNE_CUDA_CHECK(cudaDriverGetVersion(&version));
  return "cuda-driver-api-" + std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

std::string dotted(long version, long major_unit, long minor_unit) {
  return std::to_string(version / major_unit) + "." + std::to_string(version % major_unit / minor_unit) +
         "." + std::to_string(version % minor_unit);
}

}  // namespace

const char* megatune_commit() { return MEGATUNE_GIT_COMMIT; }

int cuda_device_count() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  return status == cudaSuccess ? count : 0;
}

DeviceIdentity identify_device(int device) {
  cudaDeviceProp properties{};
  MEGATUNE_CUDA_CHECK(cudaGetDeviceProperties(&properties, device));
  DeviceIdentity identity;
  std::string name = properties.name;
  if (name.rfind("NVIDIA ", 0) == 0) name = name.substr(7);
  const cost_models::HardwareCatalog& catalog = cost_models::HardwareCatalog::embedded();
  const cost_models::GpuModel* gpu = catalog.find_gpu(name);
  identity.gpu = gpu != nullptr ? gpu->name : name;
  identity.interconnect = gpu != nullptr ? gpu->default_intra_node_interconnect : "";
  identity.versions.driver = driver_version();
  int runtime = 0;
  MEGATUNE_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  identity.versions.cuda = std::to_string(runtime / 1000) + "." + std::to_string(runtime % 1000 / 10);
  identity.versions.cublas = dotted(static_cast<long>(cublasLtGetVersion()), 10000, 100);
  int nccl = 0;
  ncclGetVersion(&nccl);
  identity.versions.nccl = dotted(nccl, 10000, 100);
  identity.versions.commit = megatune_commit();
  return identity;
}

std::string serialize_identity(const DeviceIdentity& identity) {
  std::ostringstream out;
  out << identity.gpu << '\n'
      << identity.interconnect << '\n'
      << identity.versions.driver << '\n'
      << identity.versions.cuda << '\n'
      << identity.versions.cublas << '\n'
      << identity.versions.nccl << '\n'
      << identity.versions.commit << '\n';
  return out.str();
}

DeviceIdentity parse_identity(const std::string& text) {
  std::istringstream in(text);
  DeviceIdentity identity;
  std::getline(in, identity.gpu);
  std::getline(in, identity.interconnect);
  std::getline(in, identity.versions.driver);
  std::getline(in, identity.versions.cuda);
  std::getline(in, identity.versions.cublas);
  std::getline(in, identity.versions.nccl);
  std::getline(in, identity.versions.commit);
  return identity;
}

}  // namespace megatune::profiler::cuda
