// Chrome-trace / Perfetto JSON writer: complete ("X") events on one process per rank, one thread per stream.
#pragma once
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "base/json_quote.h"

namespace megatune::planner {

enum class TraceThread : int { kCompute = 0, kComm = 1, kP2p = 2 };

struct TraceEvent {
  int pid = 0;  // the global rank
  TraceThread thread = TraceThread::kCompute;
  std::string name;
  std::string category;  // op kind ("gemm", "all_reduce", ...)
  double start_s = 0.0;
  double duration_s = 0.0;
  std::vector<std::pair<std::string, std::string>> args;  // shown in Perfetto's details pane
};

struct TraceProcess {
  int pid = 0;
  std::string name;  // "rank 3 (pp1 tp0 dp1)"
};

// Writes {"traceEvents": [...], "displayTimeUnit": "ms"} with process/thread name metadata; times in µs.
void write_chrome_trace(std::ostream& out, const std::vector<TraceProcess>& processes,
                        const std::vector<TraceEvent>& events);

using base::json_quote;

}  // namespace megatune::planner
