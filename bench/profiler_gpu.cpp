// Profiler checks on the GPU machine (exit status 1 when one fails):
//   1. CUPTI kernel times vs CUDA-event time of the same cuBLASLt GEMM loop, within 3%;
//   2. the profiled cuBLASLt bf16 8192^3 GEMM (executor's GemmRunner, CUPTI median) >= 780 TFLOP/s;
//   3. with 2+ GPUs: NCCL all-reduce of 1 GiB, busbw from CUPTI within 5% of an event-timed loop.
// Usage: bench_profiler_gpu [--gpus N]   (NCCL_NVLS_ENABLE=0 is kept set)
#include <cuda_runtime.h>
#include <nccl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "executor/cuda/cuda_check.h"
#include "profiler/cuda/cuda_kernel_runner.h"
#include "profiler/cuda/cupti_tracer.h"
#include "profiler/cuda/device_fill.h"
#include "profiler/cuda/device_identity.h"
#include "profiler/cuda/nccl_collective_runner.h"
#include "profiler/profile_session.h"
#include "profiler/trace_timing.h"

using namespace megatune::profiler;
namespace ec = megatune::executor::cuda;

namespace {

bool report(const char* check, double measured, double reference, const char* unit, bool ok) {
  std::printf("%-58s %10.3f %-8s (reference %10.3f)  %s\n", check, measured, unit, reference,
              ok ? "PASS" : "FAIL");
  return ok;
}

// Check 1 and 2 on GPU 0.
bool gemm_checks() {
  MEGATUNE_CUDA_CHECK(cudaSetDevice(0));
  cuda::CuptiTracer tracer;
  cudaStream_t stream = nullptr;
  MEGATUNE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  bool ok = true;
  {
    cuda::CudaKernelRunner runner(tracer, stream);
    const GemmItem item{8192, 8192, 8192};
    const auto samples = runner.time_gemm(item, {5, 30});
    const TimingSummary profiled = summarize(*samples);
    const double tflops = item.flops() / profiled.median_s / 1e12;
    ok &= report("profiled cuBLASLt bf16 8192^3 (CUPTI median) TFLOP/s", tflops, 780.0, "TFLOP/s",
                 tflops >= 780.0);

    // The same GEMM loop timed by CUDA events and by CUPTI in one pass: 50 back-to-back launches.
    ec::GemmSpec spec = ec::GemmSpec::linear_forward(8192, 8192, 8192);
    void *a = nullptr, *b = nullptr, *d = nullptr;
    const std::size_t bytes = std::size_t(8192) * 8192 * 2;
    MEGATUNE_CUDA_CHECK(cudaMalloc(&a, bytes));
    MEGATUNE_CUDA_CHECK(cudaMalloc(&b, bytes));
    MEGATUNE_CUDA_CHECK(cudaMalloc(&d, bytes));
    cuda::fill_uniform_bf16(a, 8192 * 8192, -1, 1, 7, stream);
    cuda::fill_uniform_bf16(b, 8192 * 8192, -1, 1, 8, stream);
    ec::GemmArgs args;
    args.a = a, args.b = b, args.d = d;
    for (int i = 0; i < 5; ++i) runner.gemm_runner().run(spec, args, stream);
    tracer.flush();
    cudaEvent_t start, stop;
    MEGATUNE_CUDA_CHECK(cudaEventCreate(&start));
    MEGATUNE_CUDA_CHECK(cudaEventCreate(&stop));
    const int iterations = 50;
    MEGATUNE_CUDA_CHECK(cudaEventRecord(start, stream));
    {
      TraceRange range(tracer, 99);
      for (int i = 0; i < iterations; ++i) runner.gemm_runner().run(spec, args, stream);
    }
    MEGATUNE_CUDA_CHECK(cudaEventRecord(stop, stream));
    MEGATUNE_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    MEGATUNE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    const auto records = tracer.flush();
    double kernel_s = 0;
    int kernels = 0;
    std::string name;
    for (const TraceRecord& record : records) {
      if (record.external_id == 99 && record.kind == ActivityKind::kKernel) {
        kernel_s += record.duration_ns() * 1e-9;
        ++kernels;
        name = record.name;
      }
    }
    const double event_s = ms * 1e-3;
    const double ratio = kernel_s / event_s;
    std::printf("GEMM loop: %d kernels (%s), CUPTI sum %.3f ms, events %.3f ms\n", kernels,
                name.substr(0, 40).c_str(), kernel_s * 1e3, event_s * 1e3);
    ok &= report("CUPTI kernel time / CUDA-event time, 50x 8192^3 GEMM", ratio, 1.0, "ratio",
                 kernels == iterations && std::abs(ratio - 1.0) <= 0.03);
    cudaFree(a), cudaFree(b), cudaFree(d);
    cudaEventDestroy(start), cudaEventDestroy(stop);
  }
  cudaStreamDestroy(stream);
  return ok;
}

// Check 3: one forked process per GPU.
int all_reduce_worker(int rank, int gpus, int id_pipe_read, const std::vector<int>& id_pipe_writes) {
  try {
    MEGATUNE_CUDA_CHECK(cudaSetDevice(rank));
    ncclUniqueId id{};
    if (rank == 0) {
      if (ncclGetUniqueId(&id) != ncclSuccess) return 2;
      for (const int fd : id_pipe_writes)
        if (write(fd, &id, sizeof id) != sizeof id) return 2;
    } else if (read(id_pipe_read, &id, sizeof id) != sizeof id) {
      return 2;
    }
    cuda::CuptiTracer tracer;
    cudaStream_t stream = nullptr;
    MEGATUNE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cuda::NcclCollectiveRunner runner(tracer, rank, gpus, id, stream);
    runner.barrier();
    const CollectiveItem item{megatune::cost_models::CollectiveOp::kAllReduce, gpus, std::int64_t(1) << 30};
    const auto profiled = runner.time_collective(item, {5, 20});
    runner.barrier();
    const auto event_s = runner.event_timed_seconds(item, 3, 20);
    if (rank != 0) return 0;
    const double cupti_s = summarize(*profiled).median_s;
    const double busbw_cupti = collective_bandwidth(item, cupti_s).busbw_bytes_per_s / 1e9;
    const double busbw_events = collective_bandwidth(item, *event_s).busbw_bytes_per_s / 1e9;
    std::printf("all-reduce 1 GiB bf16 x%d: CUPTI median %.3f ms, event loop %.3f ms\n", gpus, cupti_s * 1e3,
                *event_s * 1e3);
    const bool ok = report("NCCL all-reduce 1 GiB busbw, CUPTI vs event loop (GB/s)", busbw_cupti,
                           busbw_events, "GB/s", std::abs(busbw_cupti / busbw_events - 1.0) <= 0.05);
    std::fflush(stdout);
    return ok ? 0 : 1;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "rank %d: %s\n", rank, error.what());
    return 2;
  }
}

bool all_reduce_check(int gpus) {
  std::vector<std::array<int, 2>> pipes(gpus - 1);
  for (auto& p : pipes)
    if (pipe(p.data()) != 0) return false;
  std::vector<pid_t> children;
  for (int rank = 0; rank < gpus; ++rank) {
    const pid_t child = fork();
    if (child == 0) {
      std::vector<int> writes;
      int read_fd = -1;
      for (int other = 1; other < gpus; ++other) {
        if (rank == 0) writes.push_back(pipes[other - 1][1]);
        if (rank == other) read_fd = pipes[other - 1][0];
      }
      std::_Exit(all_reduce_worker(rank, gpus, read_fd, writes));
    }
    children.push_back(child);
  }
  bool ok = true;
  for (const pid_t child : children) {
    int status = 0;
    waitpid(child, &status, 0);
    ok &= WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  int gpus = 0;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--gpus") == 0) gpus = std::atoi(argv[i + 1]);
  // Count GPUs in a child: the parent must not initialize CUDA before forking the all-reduce workers.
  if (gpus == 0) {
    int fds[2];
    if (pipe(fds) != 0) return 2;
    if (fork() == 0) {
      int count = cuda::cuda_device_count();
      if (write(fds[1], &count, sizeof count) != sizeof count) std::_Exit(2);
      std::_Exit(0);
    }
    if (read(fds[0], &gpus, sizeof gpus) != sizeof gpus) return 2;
    wait(nullptr);
  }
  if (gpus < 1) {
    std::printf("no GPU: nothing to check\n");
    return 0;
  }
  bool ok = true;
  if (gpus >= 2) {
    ok &= all_reduce_check(gpus);
  } else {
    std::printf("one GPU: the all-reduce check needs two\n");
  }
  // Last: initializes CUDA in this process.
  ok &= gemm_checks();
  std::printf("%s\n", ok ? "all profiler checks passed" : "SOME PROFILER CHECKS FAILED");
  return ok ? 0 : 1;
}
