// Names of trace activity kinds.
#include "profiler/trace_record.h"

namespace megatune::profiler {

const char* activity_kind_name(ActivityKind kind) {
  switch (kind) {
    case ActivityKind::kKernel:
      return "kernel";
    case ActivityKind::kMemcpy:
      return "memcpy";
    case ActivityKind::kMemset:
      return "memset";
  }
  return "?";
}

}  // namespace megatune::profiler
