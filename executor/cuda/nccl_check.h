// Checked NCCL calls: a failure throws std::runtime_error naming the call, NCCL's error string, its last
// error message and file:line. Shared by the executor's NcclCommunicator and the profiler's NCCL runner.
#pragma once
#include <nccl.h>

#include <stdexcept>
#include <string>

namespace megatune::executor::cuda {

// ncclInProgress is no failure (a non-blocking communicator's call still running).
inline void check_nccl(ncclResult_t result, const char* what, const char* file, int line) {
  if (result == ncclSuccess || result == ncclInProgress) return;
  std::string message =
      std::string(file) + ":" + std::to_string(line) + ": " + what + " failed: " + ncclGetErrorString(result);
  const char* detail = ncclGetLastError(nullptr);
  if (detail != nullptr && detail[0] != '\0') message += std::string(" (") + detail + ")";
  throw std::runtime_error(message);
}

}  // namespace megatune::executor::cuda

#define MEGATUNE_NCCL_CHECK(call) ::megatune::executor::cuda::check_nccl((call), #call, __FILE__, __LINE__)
