// What a measurement on this machine is attributed to: the GPU's catalog name, the intra-node fabric, and
// the driver, CUDA runtime, cuBLAS(Lt) and NCCL versions plus the megatune commit.
#pragma once
#include <string>

#include "profiler/profile_session.h"

namespace megatune::profiler::cuda {

// Identity of CUDA device `device` (initializes CUDA in the calling process). The GPU name is mapped to
// the hardware catalog ("NVIDIA H200" -> "H200 SXM"); an unknown GPU keeps the driver's name.
DeviceIdentity identify_device(int device);
int cuda_device_count();

// The megatune commit this binary was configured from ("unknown" outside a git checkout).
const char* megatune_commit();

// Line-oriented text form, to pass an identity between processes.
std::string serialize_identity(const DeviceIdentity& identity);
DeviceIdentity parse_identity(const std::string& text);

}  // namespace megatune::profiler::cuda
