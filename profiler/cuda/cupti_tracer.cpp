// CuptiTracer: CUPTI Activity API records -> TraceRecords joined to external correlation ids.
#include "profiler/cuda/cupti_tracer.h"

#include <cuda_runtime.h>
#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "executor/cuda/cuda_check.h"

namespace megatune::profiler::cuda {
namespace {

void check_cupti(CUptiResult result, const char* call, const char* file, int line) {
  if (result == CUPTI_SUCCESS) return;
  const char* message = nullptr;
  cuptiGetResultString(result, &message);
  throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + call +
                           " failed: " + (message != nullptr ? message : "unknown CUPTI error"));
}
#define MEGATUNE_CUPTI_CHECK(call) check_cupti((call), #call, __FILE__, __LINE__)

constexpr std::size_t kBufferBytes = std::size_t(8) << 20;
constexpr std::size_t kBufferAlignment = 8;

std::string demangle(const char* name) {
  if (name == nullptr) return "?";
  int status = 0;
  char* text = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  if (status != 0 || text == nullptr) return name;
  std::string out(text);
  std::free(text);
  return out;
}

}  // namespace

struct CuptiTracer::State {
  std::mutex mutex;
  std::vector<TraceRecord> records;                              // activities, external ids not joined yet
  std::unordered_map<std::uint32_t, std::uint64_t> external_of;  // correlation id -> external id
  std::uint64_t dropped = 0;
  std::vector<std::string> errors;  // from CUPTI's thread, rethrown by flush()
};

namespace {

std::atomic<CuptiTracer::State*> g_state{nullptr};

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(kBufferAlignment, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

void parse_record(CuptiTracer::State& state, const CUpti_Activity* activity) {
  TraceRecord record;
  switch (activity->kind) {
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
    case CUPTI_ACTIVITY_KIND_KERNEL: {
      const auto* kernel = reinterpret_cast<const CUpti_ActivityKernel10*>(activity);
      record.kind = ActivityKind::kKernel;
      record.name = demangle(kernel->name);
      record.start_ns = kernel->start, record.end_ns = kernel->end;
      record.device = kernel->deviceId, record.stream = kernel->streamId;
      record.correlation_id = kernel->correlationId;
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      const auto* copy = reinterpret_cast<const CUpti_ActivityMemcpy6*>(activity);
      record.kind = ActivityKind::kMemcpy;
      record.name = "memcpy " + std::to_string(copy->bytes) + " B";
      record.start_ns = copy->start, record.end_ns = copy->end;
      record.device = copy->deviceId, record.stream = copy->streamId;
      record.correlation_id = copy->correlationId;
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      const auto* set = reinterpret_cast<const CUpti_ActivityMemset4*>(activity);
      record.kind = ActivityKind::kMemset;
      record.name = "memset " + std::to_string(set->bytes) + " B";
      record.start_ns = set->start, record.end_ns = set->end;
      record.device = set->deviceId, record.stream = set->streamId;
      record.correlation_id = set->correlationId;
      break;
    }
    case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
      const auto* link = reinterpret_cast<const CUpti_ActivityExternalCorrelation*>(activity);
      if (link->externalKind == CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0)
        state.external_of[link->correlationId] = link->externalId;
      return;
    }
    default:
      return;  // runtime/driver API records: only needed for CUPTI to emit the correlations
  }
  state.records.push_back(std::move(record));
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid_bytes) {
  CuptiTracer::State* state = g_state.load();
  if (state != nullptr && valid_bytes > 0) {
    std::lock_guard<std::mutex> lock(state->mutex);
    CUpti_Activity* activity = nullptr;
    for (;;) {
      const CUptiResult status = cuptiActivityGetNextRecord(buffer, valid_bytes, &activity);
      if (status == CUPTI_ERROR_MAX_LIMIT_REACHED) break;
      if (status != CUPTI_SUCCESS) {
        const char* message = nullptr;
        cuptiGetResultString(status, &message);
        state->errors.push_back(std::string("cuptiActivityGetNextRecord: ") + (message ? message : "?"));
        break;
      }
      parse_record(*state, activity);
    }
  }
  std::free(buffer);
}

const CUpti_ActivityKind kKinds[] = {
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,    CUPTI_ACTIVITY_KIND_MEMCPY,  CUPTI_ACTIVITY_KIND_MEMSET,
    CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION, CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_DRIVER};

}  // namespace

CuptiTracer::CuptiTracer() : state_(std::make_unique<State>()) {
  State* expected = nullptr;
  if (!g_state.compare_exchange_strong(expected, state_.get()))
    throw std::runtime_error("CuptiTracer: another CuptiTracer is alive in this process");
  try {
    MEGATUNE_CUPTI_CHECK(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
    for (const CUpti_ActivityKind kind : kKinds) MEGATUNE_CUPTI_CHECK(cuptiActivityEnable(kind));
  } catch (...) {
    g_state.store(nullptr);
    throw;
  }
}

CuptiTracer::~CuptiTracer() {
  cudaDeviceSynchronize();
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  for (const CUpti_ActivityKind kind : kKinds) cuptiActivityDisable(kind);
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  g_state.store(nullptr);
}

void CuptiTracer::begin_range(std::uint64_t external_id) {
  if (external_id == kNoExternalId) throw std::invalid_argument("CuptiTracer: external id 0 is reserved");
  MEGATUNE_CUPTI_CHECK(
      cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, external_id));
}

void CuptiTracer::end_range() {
  uint64_t popped = 0;
  MEGATUNE_CUPTI_CHECK(
      cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &popped));
}

std::vector<TraceRecord> CuptiTracer::flush() {
  MEGATUNE_CUDA_CHECK(cudaDeviceSynchronize());
  MEGATUNE_CUPTI_CHECK(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
  std::vector<TraceRecord> out;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (!state_->errors.empty()) {
      const std::string error = state_->errors.front();
      state_->errors.clear();
      throw std::runtime_error("CuptiTracer: " + error);
    }
    out.swap(state_->records);
    for (TraceRecord& record : out) {
      const auto found = state_->external_of.find(record.correlation_id);
      if (found != state_->external_of.end()) record.external_id = found->second;
    }
    state_->external_of.clear();
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped) == CUPTI_SUCCESS) state_->dropped += dropped;
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const TraceRecord& a, const TraceRecord& b) { return a.start_ns < b.start_ns; });
  return out;
}

std::uint64_t CuptiTracer::dropped_records() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->dropped;
}

}  // namespace megatune::profiler::cuda
