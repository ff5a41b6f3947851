// Forked per-GPU profiling workers.
#include "profiler/cuda/gpu_profile_workers.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <stdexcept>

#include "cost_models/cost_database.h"
#include "executor/cuda/cuda_check.h"
#include "executor/cuda/nccl_check.h"
#include "profiler/cuda/cuda_kernel_runner.h"
#include "profiler/cuda/cupti_tracer.h"
#include "profiler/cuda/device_identity.h"
#include "profiler/cuda/nccl_collective_runner.h"

namespace megatune::profiler::cuda {
namespace {

// Fixed-size message from a worker to the parent (smaller than PIPE_BUF: writes are atomic).
struct WorkerMessage {
  enum Type : std::int32_t { kKernelDone, kCollectiveDone, kCounts, kError } type;
  std::int32_t rank;
  std::int32_t a, b, c, d;  // kCounts: kernels measured/unsupported, collectives measured/unsupported
  char text[200];
};
static_assert(sizeof(WorkerMessage) < PIPE_BUF);

void write_all(int fd, const void* data, std::size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::runtime_error(std::string("pipe write failed: ") + std::strerror(errno));
    p += n, size -= std::size_t(n);
  }
}

bool read_all(int fd, void* data, std::size_t size) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = ::read(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n, size -= std::size_t(n);
  }
  return true;
}

void send_message(int fd, WorkerMessage message) { write_all(fd, &message, sizeof message); }

int worker_main(const GpuProfileJob& job, int rank, int progress_fd, const std::vector<int>& id_write_fds,
                int id_read_fd) {
  try {
    MEGATUNE_CUDA_CHECK(cudaSetDevice(rank));
    const DeviceIdentity identity = identify_device(rank);
    CuptiTracer tracer;
    cost_models::Database database = cost_models::open_cost_database(job.database_path);
    ProfileCounts collectives, kernels;
    if (job.gpus > 1 && !job.sweep.collectives.empty()) {
      ncclUniqueId id{};
      if (rank == 0) {
        MEGATUNE_NCCL_CHECK(ncclGetUniqueId(&id));
        for (const int fd : id_write_fds) write_all(fd, &id, sizeof id);
      } else if (!read_all(id_read_fd, &id, sizeof id)) {
        throw std::runtime_error("did not receive the NCCL unique id from rank 0");
      }
      cudaStream_t stream = nullptr;
      MEGATUNE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      {
        NcclCollectiveRunner runner(tracer, rank, job.gpus, id, stream);
        runner.barrier();
        collectives = run_collective_sweep(
            rank == 0 ? &database : nullptr, runner, job.sweep.collectives, identity, job.collective_policy,
            [&](const ProfileProgress& p) {
              if (rank == 0)
                send_message(progress_fd, {WorkerMessage::kCollectiveDone, rank, int(p.done), 0, 0, 0, {}});
            });
      }
      cudaStreamDestroy(stream);
    }
    cudaStream_t stream = nullptr;
    MEGATUNE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    {
      CudaKernelRunner runner(tracer, stream, (std::uint64_t(rank) + 1) << 40);
      kernels = run_kernel_sweep(
          database, runner, job.sweep, identity, job.kernel_policy,
          [&](const ProfileProgress&) {
            send_message(progress_fd, {WorkerMessage::kKernelDone, rank, 0, 0, 0, 0, {}});
          },
          rank, job.gpus);
    }
    cudaStreamDestroy(stream);
    send_message(progress_fd, {WorkerMessage::kCounts,
                               rank,
                               kernels.measured,
                               kernels.unsupported,
                               collectives.measured,
                               collectives.unsupported,
                               {}});
    return 0;
  } catch (const std::exception& error) {
    WorkerMessage message{WorkerMessage::kError, rank, 0, 0, 0, 0, {}};
    std::snprintf(message.text, sizeof message.text, "%s", error.what());
    try {
      send_message(progress_fd, message);
    } catch (...) {
    }
    return 1;
  }
}

}  // namespace

HostGpus probe_host_gpus() {
  int fds[2];
  if (::pipe(fds) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  std::fflush(nullptr);  // a child must not inherit (and print again) the parent's buffered output
  std::cout.flush();
  const pid_t child = ::fork();
  if (child < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (child == 0) {
    ::close(fds[0]);
    int status = 0;
    try {
      const int count = cuda_device_count();
      const std::string text = count > 0
                                   ? std::to_string(count) + "\n" + serialize_identity(identify_device(0))
                                   : std::string("0\n");
      write_all(fds[1], text.data(), text.size());
    } catch (const std::exception& error) {
      const std::string text = std::string("error\n") + error.what();
      write_all(fds[1], text.data(), text.size());
      status = 1;
    }
    ::close(fds[1]);
    std::_Exit(status);
  }
  ::close(fds[1]);
  std::string text;
  char buffer[512];
  for (;;) {
    const ssize_t n = ::read(fds[0], buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buffer, std::size_t(n));
  }
  ::close(fds[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  if (text.rfind("error\n", 0) == 0) throw std::runtime_error("GPU probe: " + text.substr(6));
  const std::size_t newline = text.find('\n');
  HostGpus out;
  out.count = newline == std::string::npos ? 0 : std::atoi(text.substr(0, newline).c_str());
  if (out.count <= 0) throw std::runtime_error("no CUDA GPU is visible (cudaGetDeviceCount returned 0)");
  out.identity = parse_identity(text.substr(newline + 1));
  return out;
}

GpuProfileOutcome run_gpu_profile(const GpuProfileJob& job, const ProgressCallback& progress) {
  const auto start = std::chrono::steady_clock::now();
  int progress_pipe[2];
  if (::pipe(progress_pipe) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  std::vector<std::array<int, 2>> id_pipes(std::max(0, job.gpus - 1));
  for (auto& fds : id_pipes) {
    if (::pipe(fds.data()) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  }
  std::vector<pid_t> children;
  std::fflush(nullptr);  // children must not inherit (and print again) the parent's buffered output
  std::cout.flush();
  for (int rank = 0; rank < job.gpus; ++rank) {
    const pid_t child = ::fork();
    if (child < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
    if (child == 0) {
      ::close(progress_pipe[0]);
      std::vector<int> write_fds;
      int read_fd = -1;
      for (int other = 1; other < job.gpus; ++other) {
        auto& fds = id_pipes[other - 1];
        if (rank == 0) {
          write_fds.push_back(fds[1]);
          ::close(fds[0]);
        } else if (other == rank) {
          read_fd = fds[0];
          ::close(fds[1]);
        } else {
          ::close(fds[0]);
          ::close(fds[1]);
        }
      }
      const int status = worker_main(job, rank, progress_pipe[1], write_fds, read_fd);
      std::cout.flush();
      std::cerr.flush();
      std::_Exit(status);
    }
    children.push_back(child);
  }
  ::close(progress_pipe[1]);
  for (auto& fds : id_pipes) ::close(fds[0]), ::close(fds[1]);

  GpuProfileOutcome outcome;
  const std::size_t total = job.sweep.collectives.size() + job.sweep.kernel_count();
  std::size_t collectives_done = 0, kernels_done = 0;
  WorkerMessage message{};
  while (read_all(progress_pipe[0], &message, sizeof message)) {
    switch (message.type) {
      case WorkerMessage::kCollectiveDone:
        collectives_done = std::size_t(message.a);
        break;
      case WorkerMessage::kKernelDone:
        ++kernels_done;
        break;
      case WorkerMessage::kCounts:
        outcome.kernels += {message.a, message.b};
        outcome.collectives += {message.c, message.d};
        break;
      case WorkerMessage::kError:
        outcome.errors.push_back("GPU " + std::to_string(message.rank) + ": " + message.text);
        break;
    }
    if (progress) progress({collectives_done + kernels_done, total, ""});
  }
  ::close(progress_pipe[0]);
  for (std::size_t rank = 0; rank < children.size(); ++rank) {
    int status = 0;
    ::waitpid(children[rank], &status, 0);
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok && outcome.errors.empty())
      outcome.errors.push_back("GPU " + std::to_string(rank) + ": worker exited abnormally (status " +
                               std::to_string(status) + ")");
  }
  outcome.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return outcome;
}

}  // namespace megatune::profiler::cuda
