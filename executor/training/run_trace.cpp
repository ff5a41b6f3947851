// RankTracer and the run manifest: JSON lines in the traced-run format (layouts/run_trace_format.h).
#include "executor/training/run_trace.h"

#include "git_commit.h"  // generated at build time (executor/CMakeLists.txt)
#ifndef MEGATUNE_GIT_COMMIT
#define MEGATUNE_GIT_COMMIT "unknown"
#endif

#include <cmath>
#include <ctime>
#include <filesystem>
#include <sstream>

#include "base/json_quote.h"
#include "base/user_error.h"
#include "executor/checkpoint/durable_file.h"
#include "executor/training/trainer.h"
#include "layouts/run_trace_format.h"

namespace megatune::executor {
namespace {

using base::json_quote;

std::string number(double value) {
  if (!std::isfinite(value)) return "null";
  std::ostringstream out;
  out.precision(9);
  out << value;
  return out.str();
}

std::string string_array(const std::vector<std::string>& values) {
  std::string out = "[";
  for (std::size_t i = 0; i < values.size(); ++i) out += (i ? "," : "") + json_quote(values[i]);
  return out + "]";
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char buffer[32];
  std::strftime(buffer, sizeof buffer, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return buffer;
}

void make_trace_dir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (!std::filesystem::is_directory(dir))
    throw UserError("--trace-dir " + dir + ": cannot create the directory; choose a writable path");
}

}  // namespace

void parse_trace_iterations(const std::string& text, RunTraceOptions& options) {
  const std::size_t colon = text.find(':');
  try {
    std::size_t used = 0;
    if (colon == std::string::npos) throw std::invalid_argument("no colon");
    options.first_iteration = std::stoll(text.substr(0, colon), &used);
    if (used != colon) throw std::invalid_argument("start");
    options.iterations = std::stoll(text.substr(colon + 1), &used);
    if (used != text.size() - colon - 1) throw std::invalid_argument("count");
  } catch (const std::exception&) {
    throw UserError("--trace-iterations " + text + ": give START:COUNT, e.g. 2:3 (iterations 2, 3 and 4)");
  }
  if (options.first_iteration < 1 || options.iterations < 1)
    throw UserError("--trace-iterations " + text + ": START and COUNT must be >= 1");
}

void resolve_trace_window(RunTraceOptions& options, std::int64_t train_iters) {
  if (options.dir.empty()) return;
  if (options.first_iteration == 0) {
    options.first_iteration = train_iters >= 2 ? 2 : 1;
    options.iterations = std::min<std::int64_t>(3, train_iters - options.first_iteration + 1);
  }
  if (options.first_iteration + options.iterations - 1 > train_iters)
    throw UserError("--trace-iterations " + std::to_string(options.first_iteration) + ":" +
                    std::to_string(options.iterations) + " ends after --train-iters " +
                    std::to_string(train_iters) + "; trace fewer iterations or train more");
}

RankTracer::RankTracer(RunTraceOptions options, Backend& backend)
    : options_(std::move(options)), backend_(backend) {
  make_trace_dir(options_.dir);
}

bool RankTracer::in_window(std::int64_t iteration) const {
  return iteration >= options_.first_iteration && iteration < options_.first_iteration + options_.iterations;
}

void RankTracer::before_step(std::int64_t iteration) {
  if (!in_window(iteration)) return;
  (void)backend_.timed_ops();  // drop anything timed before the window
  backend_.set_op_timing(true);
}

void RankTracer::after_step(std::int64_t iteration, const StepResult& step) {
  if (!in_window(iteration)) return;
  backend_.set_op_timing(false);
  Iteration traced;
  traced.iteration = iteration;
  traced.step_s = step.elapsed_s;
  traced.loss = step.loss;
  traced.ops = backend_.timed_ops();
  traced.device = backend_.sample_device();
  iterations_.push_back(std::move(traced));
  device_memory_used_bytes_ = std::max(device_memory_used_bytes_, backend_.device_memory_used_bytes());
}

void RankTracer::finish() {
  if (iterations_.empty())
    throw UserError("--trace-iterations: no iteration of the window " +
                    std::to_string(options_.first_iteration) + ":" + std::to_string(options_.iterations) +
                    " ran (resumed past it?); choose later iterations");
  std::ostringstream out;
  const layouts::DenseCoordinates& c = options_.coordinates;
  out << "{\"record\":\"rank\",\"version\":" << layouts::kRunTraceVersion << ",\"rank\":" << options_.rank
      << ",\"tp\":" << c.tp << ",\"pp\":" << c.pp << ",\"dp\":" << c.dp << ",\"cp\":" << c.cp
      << ",\"backend\":" << json_quote(backend_.name())
      << ",\"arena_capacity_bytes\":" << backend_.arena_capacity_bytes()
      << ",\"arena_used_bytes\":" << backend_.arena_used_bytes()
      << ",\"device_memory_used_bytes\":" << device_memory_used_bytes_ << ",\"arena\":[";
  const std::vector<ArenaUse>& arena = backend_.arena_breakdown();
  for (std::size_t i = 0; i < arena.size(); ++i)
    out << (i ? "," : "") << "{\"what\":" << json_quote(arena[i].what) << ",\"bytes\":" << arena[i].bytes
        << ",\"allocations\":" << arena[i].allocations << "}";
  out << "]}\n";
  for (const Iteration& it : iterations_) {
    out << "{\"record\":\"iteration\",\"iteration\":" << it.iteration << ",\"step_s\":" << number(it.step_s)
        << ",\"loss\":" << number(it.loss) << ",\"ops\":" << it.ops.size()
        << ",\"sm_clock_mhz\":" << number(it.device.sm_clock_mhz)
        << ",\"power_w\":" << number(it.device.power_w) << "}\n";
    for (std::size_t i = 0; i < it.ops.size(); ++i) {
      const Backend::TimedOp& t = it.ops[i];
      const double start_s = t.start_ms * 1e-3;
      out << "{\"record\":\"op\",\"iteration\":" << it.iteration << ",\"id\":" << i << ",\"stream\":\""
          << (t.op.is_communication() ? "communication" : "compute") << "\",\"start_s\":" << number(start_s)
          << ",\"end_s\":" << number(start_s + t.ms * 1e-3) << ',';
      layouts::write_op_trace_fields(out, t.op);
      out << ",\"op\":" << json_quote(layouts::to_string(t.op)) << "}\n";
    }
  }
  const std::string path =
      (std::filesystem::path(options_.dir) / layouts::run_trace_rank_file(options_.rank)).string();
  checkpoint::replace_file_atomically(path, out.str());
}

void write_run_manifest(const RunManifest& m) {
  make_trace_dir(m.trace.dir);
  std::ostringstream out;
  out << "{\n  \"format\": \"" << layouts::kRunTraceFormat
      << "\",\n  \"version\": " << layouts::kRunTraceVersion << ",\n  \"created_utc\": \"" << utc_now()
      << "\",\n  \"megatune_commit\": " << json_quote(MEGATUNE_GIT_COMMIT)
      << ",\n  \"command\": " << string_array(m.command)
      << ",\n  \"model_args\": " << string_array(m.model_args) << ",\n  \"model\": " << json_quote(m.model)
      << ",\n  \"parameters\": " << m.parameters << ",\n  \"layout\": " << json_quote(m.layout)
      << ",\n  \"world_size\": " << m.world_size << ",\n  \"micro_batch_size\": " << m.micro_batch_size
      << ",\n  \"global_batch_size\": " << m.global_batch_size
      << ",\n  \"num_microbatches\": " << m.num_microbatches << ",\n  \"seq_length\": " << m.seq_length
      << ",\n  \"model_flops_per_iteration\": " << number(m.model_flops_per_iteration)
      << ",\n  \"device\": " << json_quote(m.device) << ",\n  \"backend\": " << json_quote(m.backend)
      << ",\n  \"gpu\": " << json_quote(m.gpu) << ",\n  \"peak_tflops\": " << number(m.peak_tflops)
      << ",\n  \"cluster\": " << json_quote(m.cluster) << ",\n  \"timing\": " << json_quote(m.timing)
      << ",\n  \"trace_first_iteration\": " << m.trace.first_iteration
      << ",\n  \"trace_iterations\": " << m.trace.iterations << ",\n  \"ranks\": [";
  for (int r = 0; r < m.world_size; ++r) {
    const std::string file = layouts::run_trace_rank_file(r);
    if (!std::filesystem::is_regular_file(std::filesystem::path(m.trace.dir) / file))
      throw UserError("--trace-dir " + m.trace.dir + ": rank " + std::to_string(r) + " wrote no " + file +
                      "; the run did not finish");
    out << (r ? ", " : "") << "{\"rank\": " << r << ", \"file\": \"" << file << "\"}";
  }
  out << "]\n}\n";
  checkpoint::replace_file_atomically(
      (std::filesystem::path(m.trace.dir) / layouts::kRunTraceManifest).string(), out.str());
}

}  // namespace megatune::executor
