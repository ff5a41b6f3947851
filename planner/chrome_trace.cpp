// Chrome-trace JSON writer (the Trace Event Format that chrome://tracing and ui.perfetto.dev open).
#include "planner/chrome_trace.h"

#include <cstdio>

namespace megatune::planner {

namespace {
const char* thread_name(TraceThread thread) {
  switch (thread) {
    case TraceThread::kCompute:
      return "compute";
    case TraceThread::kComm:
      return "comm";
    case TraceThread::kP2p:
      return "p2p";
  }
  return "?";
}

std::string micros(double seconds) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.3f", seconds * 1e6);
  return buf;
}
}  // namespace

void write_chrome_trace(std::ostream& out, const std::vector<TraceProcess>& processes,
                        const std::vector<TraceEvent>& events) {
  out << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  bool first = true;
  auto sep = [&] {
    if (!first) out << ",\n";
    first = false;
  };
  for (const TraceProcess& p : processes) {
    sep();
    out << "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":" << p.pid
        << ",\"tid\":0,\"args\":{\"name\":" << json_quote(p.name) << "}}";
    sep();
    out << "{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":" << p.pid
        << ",\"tid\":0,\"args\":{\"sort_index\":" << p.pid << "}}";
    for (TraceThread t : {TraceThread::kCompute, TraceThread::kComm, TraceThread::kP2p}) {
      sep();
      out << "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":" << p.pid << ",\"tid\":" << static_cast<int>(t)
          << ",\"args\":{\"name\":\"" << thread_name(t) << "\"}}";
    }
  }
  for (const TraceEvent& e : events) {
    sep();
    out << "{\"ph\":\"X\",\"pid\":" << e.pid << ",\"tid\":" << static_cast<int>(e.thread)
        << ",\"name\":" << json_quote(e.name) << ",\"cat\":" << json_quote(e.category)
        << ",\"ts\":" << micros(e.start_s) << ",\"dur\":" << micros(e.duration_s) << ",\"args\":{";
    for (std::size_t i = 0; i < e.args.size(); ++i) {
      if (i) out << ',';
      out << json_quote(e.args[i].first) << ':' << json_quote(e.args[i].second);
    }
    out << "}}";
  }
  out << "\n]}\n";
}

}  // namespace megatune::planner
