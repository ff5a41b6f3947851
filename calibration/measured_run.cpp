// Reading a traced run (JSON via cost_models::JsonValue) and checking its ops against the step program.
#include "calibration/measured_run.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "base/user_error.h"
#include "cost_models/json_value.h"
#include "layouts/run_trace_format.h"
#include "layouts/step_program.h"

namespace megatune::calibration {
namespace {

using cost_models::JsonValue;
namespace fs = std::filesystem;

std::string read_regular_file(const fs::path& path, const std::string& what) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (!fs::exists(status))
    throw UserError(
        "--run " + what + ": " + path.string() +
        " does not exist (not a traced run, or it did not finish); run megatune train --trace-dir");
  if (!fs::is_regular_file(status))
    throw UserError("--run " + what + ": " + path.string() +
                    " is not a regular file; give a trace directory");
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) throw UserError("--run " + what + ": cannot read " + path.string());
  return text.str();
}

// `file` and, for a JSON-lines file, the `line` the text is (its position is then that line's column).
JsonValue parse_json(const std::string& text, const std::string& file, int line = 0) {
  try {
    return JsonValue::parse(text);
  } catch (const cost_models::JsonParseError& e) {
    const std::string at = line > 0 ? file + " line " + std::to_string(line) + ", column " +
                                          std::to_string(e.column()) + ": " + e.problem()
                                    : file + ": " + e.what();
    throw UserError(at + " (a corrupt trace: re-run megatune train --trace-dir)");
  }
}

// Field accessors that turn type errors into one line naming the file.
struct Reader {
  const JsonValue& value;
  const std::string& where;
  const JsonValue& at(const char* key) const {
    const JsonValue* v = value.find(key);
    if (v == nullptr) throw UserError(where + ": no \"" + key + "\" (a corrupt or foreign trace)");
    return *v;
  }
  template <typename F>
  auto get(const char* key, F f) const {
    try {
      return f(at(key));
    } catch (const UserError&) {
      throw;
    } catch (const std::exception& e) {
      throw UserError(where + ": \"" + key + "\": " + e.what() + " (a corrupt trace)");
    }
  }
  std::string str(const char* key) const {
    return get(key, [](const JsonValue& v) { return v.as_string(); });
  }
  std::int64_t integer(const char* key) const {
    return get(key, [](const JsonValue& v) { return v.as_int64(); });
  }
  double number(const char* key) const {
    return get(key, [](const JsonValue& v) { return v.is_null() ? -1.0 : v.as_number(); });
  }
  std::vector<std::string> strings(const char* key) const {
    return get(key, [](const JsonValue& v) {
      std::vector<std::string> out;
      for (const JsonValue& s : v.as_array()) out.push_back(s.as_string());
      return out;
    });
  }
};

void check_version(const Reader& r) {
  if (r.integer("version") != layouts::kRunTraceVersion)
    throw UserError(r.where + ": trace version " + std::to_string(r.integer("version")) +
                    ", this megatune reads " + std::to_string(layouts::kRunTraceVersion) +
                    "; re-run megatune train --trace-dir");
}

TracedOp read_op(const Reader& r) {
  TracedOp op;
  op.id = static_cast<int>(r.integer("id"));
  op.communication_stream = r.str("stream") == "communication";
  op.start_s = r.number("start_s");
  op.end_s = r.number("end_s");
  op.kind = r.str("kind");
  op.phase = r.str("phase");
  op.dtype = r.str("dtype");
  op.label = r.str("label");
  op.group = r.str("group");
  op.text = r.str("op");
  op.layer = r.integer("layer");
  op.microbatch = r.integer("microbatch");
  op.chunk = r.integer("chunk");
  op.m = r.integer("m");
  op.n = r.integer("n");
  op.k = r.integer("k");
  op.bytes = r.integer("bytes");
  op.group_size = r.integer("group_size");
  op.peer = r.integer("peer");
  op.accumulate = r.get("accumulate", [](const JsonValue& v) { return v.as_bool(); });
  op.attention = r.get("attention", [](const JsonValue& v) {
    std::vector<std::int64_t> out;
    for (const JsonValue& x : v.as_array()) out.push_back(x.as_int64());
    // Traces before the value head dim was recorded: [batch, heads, kv, seq_q, seq_kv, dim, causal].
    if (out.size() == 7) out.push_back(out[5]);
    return out;
  });
  if (op.end_s < op.start_s)
    throw UserError(r.where + ": op " + std::to_string(op.id) + " ('" + op.text +
                    "') ends before it starts (" + "start_s " + std::to_string(op.start_s) + ", end_s " +
                    std::to_string(op.end_s) + "): a corrupt trace; re-run megatune train --trace-dir");
  return op;
}

TracedIteration read_iteration(const Reader& r, const std::vector<TracedIteration>& before) {
  TracedIteration it;
  it.iteration = r.integer("iteration");
  it.step_s = r.number("step_s");
  it.loss = r.number("loss");
  it.sm_clock_mhz = r.number("sm_clock_mhz");
  it.power_w = r.number("power_w");
  it.recorded_ops = r.integer("ops");
  if (!(it.step_s > 0))
    throw UserError(r.where + ": iteration " + std::to_string(it.iteration) + " has step_s " +
                    std::to_string(it.step_s) +
                    ", not a positive step time: a corrupt trace; re-run megatune train --trace-dir");
  if (!before.empty() && it.iteration <= before.back().iteration)
    throw UserError(r.where + ": iteration " + std::to_string(it.iteration) + " follows iteration " +
                    std::to_string(before.back().iteration) +
                    " (iterations must increase): a corrupt trace; re-run megatune train --trace-dir");
  return it;
}

// The op lines of an iteration must be as many as its record says (a file cut or edited between them).
void check_op_count(const TracedIteration& it, const std::string& where) {
  if (static_cast<std::int64_t>(it.ops.size()) != it.recorded_ops)
    throw UserError(where + ": iteration " + std::to_string(it.iteration) + " records " +
                    std::to_string(it.recorded_ops) + " ops, the file holds " +
                    std::to_string(it.ops.size()) +
                    " op lines: a truncated or edited trace; re-run megatune train --trace-dir");
}

TracedRank read_rank(const fs::path& path, int expected_rank) {
  const std::string where = path.string();
  std::istringstream lines(read_regular_file(path, path.parent_path().string()));
  TracedRank rank;
  std::string line;
  int number = 0;
  bool header = false;
  while (std::getline(lines, line)) {
    ++number;
    if (line.empty()) continue;
    const std::string at = where + " line " + std::to_string(number);
    const JsonValue value = parse_json(line, where, number);
    const Reader r{value, at};
    const std::string record = r.str("record");
    if (record == "rank") {
      check_version(r);
      rank.rank = static_cast<int>(r.integer("rank"));
      rank.tp = static_cast<int>(r.integer("tp"));
      rank.pp = static_cast<int>(r.integer("pp"));
      rank.dp = static_cast<int>(r.integer("dp"));
      rank.cp = static_cast<int>(r.integer("cp"));
      rank.backend = r.str("backend");
      rank.arena_capacity_bytes = r.integer("arena_capacity_bytes");
      rank.arena_used_bytes = r.integer("arena_used_bytes");
      rank.device_memory_used_bytes = r.integer("device_memory_used_bytes");
      for (const JsonValue& use : r.at("arena").as_array()) {
        const Reader u{use, at};
        rank.arena.push_back({u.str("what"), u.integer("bytes")});
      }
      header = true;
    } else if (!header) {
      throw UserError(at + ": the first line must be the \"rank\" record (a corrupt trace)");
    } else if (record == "iteration") {
      if (!rank.iterations.empty()) check_op_count(rank.iterations.back(), where);
      rank.iterations.push_back(read_iteration(r, rank.iterations));
    } else if (record == "op") {
      if (rank.iterations.empty() || rank.iterations.back().iteration != r.integer("iteration"))
        throw UserError(at + ": an op outside its iteration record (a corrupt trace)");
      std::vector<TracedOp>& ops = rank.iterations.back().ops;
      ops.push_back(read_op(r));
      if (ops.back().id != static_cast<int>(ops.size()) - 1)
        throw UserError(at + ": op ids must count 0, 1, 2, ... within an iteration (a corrupt trace)");
    } else {
      throw UserError(at + ": unknown record \"" + record + "\"");
    }
  }
  if (!header || rank.iterations.empty())
    throw UserError(where + ": no rank header or no traced iteration (a truncated trace)");
  check_op_count(rank.iterations.back(), where);
  if (rank.rank != expected_rank)
    throw UserError(where + ": holds rank " + std::to_string(rank.rank) + ", run.json lists it as rank " +
                    std::to_string(expected_rank));
  return rank;
}

// run.json's "ranks": every rank of the world once, each with a file of its own in DIR.
void check_rank_list(const JsonValue::Array& ranks, int world_size, const std::string& where) {
  const std::string fix = " (an edited run.json); list each rank once, or re-run megatune train --trace-dir";
  std::map<std::int64_t, std::string> files_by_rank;
  std::set<std::string> files;
  for (const JsonValue& entry : ranks) {
    const Reader e{entry, where};
    const std::int64_t rank = e.integer("rank");
    const std::string file = e.str("file");
    if (file.find('/') != std::string::npos)
      throw UserError(where + ": rank file " + file + " is not in DIR");
    if (rank < 0 || rank >= world_size)
      throw UserError(where + ": lists rank " + std::to_string(rank) + ", outside the run's world size " +
                      std::to_string(world_size) + fix);
    if (!files_by_rank.emplace(rank, file).second)
      throw UserError(where + ": lists rank " + std::to_string(rank) + " twice (" + files_by_rank[rank] +
                      " and " + file + ")" + fix);
    if (!files.insert(file).second) throw UserError(where + ": lists rank file " + file + " twice" + fix);
  }
  if (static_cast<int>(ranks.size()) != world_size)
    throw UserError(where + ": lists " + std::to_string(ranks.size()) +
                    " rank files, the run has world size " + std::to_string(world_size) + fix);
}

}  // namespace

MeasuredRun read_measured_run(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec))
    throw UserError("--run " + dir + ": no such directory; give the --trace-dir of a megatune train run");
  if (!fs::is_directory(dir, ec))
    throw UserError("--run " + dir + ": not a directory; give the --trace-dir of a megatune train run");
  const fs::path manifest_path = fs::path(dir) / layouts::kRunTraceManifest;
  const std::string where = manifest_path.string();
  const JsonValue manifest = parse_json(read_regular_file(manifest_path, dir), where);
  if (!manifest.is_object()) throw UserError(where + ": not a JSON object (a corrupt trace)");
  const Reader r{manifest, where};
  if (r.str("format") != layouts::kRunTraceFormat)
    throw UserError(where + ": format \"" + r.str("format") + "\" is not " + layouts::kRunTraceFormat);
  check_version(r);
  MeasuredRun run;
  run.dir = dir;
  run.command = r.strings("command");
  run.model_args = r.strings("model_args");
  run.model = r.str("model");
  run.layout = r.str("layout");
  run.device = r.str("device");
  run.backend = r.str("backend");
  run.gpu = r.str("gpu");
  run.cluster = r.str("cluster");
  run.timing = r.str("timing");
  run.created_utc = r.str("created_utc");
  if (manifest.find("megatune_commit") != nullptr) run.megatune_commit = r.str("megatune_commit");
  run.world_size = static_cast<int>(r.integer("world_size"));
  run.micro_batch_size = static_cast<int>(r.integer("micro_batch_size"));
  run.global_batch_size = static_cast<int>(r.integer("global_batch_size"));
  run.model_flops_per_iteration = r.number("model_flops_per_iteration");
  run.peak_tflops = r.number("peak_tflops");
  run.trace_first_iteration = r.integer("trace_first_iteration");
  run.trace_iterations = r.integer("trace_iterations");
  const JsonValue& ranks = r.at("ranks");
  if (!ranks.is_array() || ranks.as_array().empty())
    throw UserError(where + ": \"ranks\" lists no rank file");
  check_rank_list(ranks.as_array(), run.world_size, where);
  for (const JsonValue& entry : ranks.as_array()) {
    const Reader e{entry, where};
    run.ranks.push_back(read_rank(fs::path(dir) / e.str("file"), static_cast<int>(e.integer("rank"))));
  }
  return run;
}

namespace {

// The first identity field in which the traced op and the program op differ, or "".
std::string first_difference(const TracedOp& t, const layouts::Op& p, bool fp32_run) {
  static const char* dtype_names[] = {"bf16", "fp16", "fp32", "fp8"};
  const std::vector<std::int64_t> attention = {
      p.attention.batch,  p.attention.heads,    p.attention.kv_heads,       p.attention.seq_q,
      p.attention.seq_kv, p.attention.head_dim, p.attention.causal ? 1 : 0, p.attention.value_head_dim()};
  if (t.kind != layouts::op_kind_name(p.kind)) return "kind";
  if (t.phase != layouts::op_phase_name(p.phase)) return "phase";
  if (t.dtype != dtype_names[static_cast<int>(p.dtype)] && !fp32_run) return "dtype";
  if (t.label != p.label) return "label";
  if (t.layer != p.layer) return "layer";
  if (t.microbatch != p.microbatch) return "microbatch";
  if (t.m != p.m || t.n != p.n || t.k != p.k || t.accumulate != p.accumulate) return "GEMM shape";
  if (t.attention != attention) return "attention shape";
  if (t.bytes != p.bytes && !fp32_run) return "bytes";
  if (t.group != layouts::comm_group_name(p.group) || t.group_size != p.group_size) return "group";
  return "";
}

}  // namespace

bool fp32_run(const MeasuredRun& run) {
  return run.device == "cpu" && run.backend.find("bf16") == std::string::npos;
}

void check_join(const MeasuredRun& run, const layouts::ModelSpec& model,
                const layouts::ParallelConfig& config, JoinTarget target,
                const layouts::StepProgramOptions& step) {
  const std::string context = "--run " + run.dir + ": ";
  const std::string fix =
      target == JoinTarget::kRunFlags
          ? ": the trace does not match the model and layout its run.json records (" + run.model + ", " +
                run.layout + "): an edited or foreign trace; re-run megatune train --trace-dir"
          : ": the trace was made with another model or layout (the run says " + run.model + ", " +
                run.layout + "); pass the run's own flags with --planner::simulate-args, or drop them";
  if (run.world_size != config.world_size)
    throw UserError(context + "the run has " + std::to_string(run.world_size) + " ranks, the layout " +
                    std::to_string(config.world_size) + fix);
  for (const TracedRank& rank : run.ranks) {
    const layouts::StepProgram program = layouts::build_step_program(model, config, rank.rank, step);
    for (const TracedIteration& it : rank.iterations) {
      const std::string where =
          context + "rank " + std::to_string(rank.rank) + " iteration " + std::to_string(it.iteration);
      for (std::size_t i = 0; i < std::min(it.ops.size(), program.ops.size()); ++i) {
        const std::string field = first_difference(it.ops[i], program.ops[i], fp32_run(run));
        // Routed token counts are the data's: the step program assumes balanced routing across expert ranks.
        const bool routed = field == "GEMM shape" && it.ops[i].label.rfind("expert", 0) == 0;
        if (!field.empty())
          throw UserError(where + " op " + std::to_string(i) + " differs in " + field + " (traced '" +
                          it.ops[i].text + "', step program '" + layouts::to_string(program.ops[i]) + "')" +
                          (routed
                               ? ": the tokens routed to this expert rank are not the step program's "
                                 "balanced share (traces of --expert-model-parallel-size > 1 do not join yet)"
                               : fix));
      }
      if (it.ops.size() < program.ops.size())
        throw UserError(where + " issued " + std::to_string(it.ops.size()) + " ops, the step program has " +
                        std::to_string(program.ops.size()) + fix);
    }
  }
}

}  // namespace megatune::calibration
