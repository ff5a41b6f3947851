// `megatune train --trace-dir` then `megatune compare` on the CPU backend: every op joined to the step
// program (identity, counts, bytes), positive times, the table's rows, well-formed HTML (and in headless
// Chromium when /usr/bin/chromium exists), a Perfetto file with both tracks; bad inputs give one clear line.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "base/user_error.h"
#include "calibration/measured_run.h"
#include "cost_models/cost_database.h"
#include "cost_models/record_store.h"
#include "executor/cpu/cpu_backend.h"
#include "executor/parallel/communicator.h"
#include "executor/training/run_setup.h"
#include "executor/training/thread_run.h"
#include "layouts/flops.h"
#include "layouts/step_program.h"
#include "tools/compare_command.h"
#include "tools/megatron_args.h"

namespace megatune::tools {
namespace {

namespace fs = std::filesystem;

struct Layout {
  layouts::ModelSpec model;
  layouts::ParallelConfig config;
};

Layout parse(const std::vector<std::string>& args) {
  CLI::App app{"test"};
  MegatronArgs megatron;
  add_model_flags(app, megatron);
  add_parallel_flags(app, megatron);
  add_batch_flags(app, megatron);
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  app.parse(reversed);
  Layout l{resolve_model(megatron), resolve_parallel(megatron)};
  l.config.validate(l.model);
  return l;
}

class CompareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("megatune_compare_test_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string traced_run(const std::vector<std::string>& args, const std::string& name) {
    return traced_run_in(dir_, args, name);
  }
  // Trains `args` on the CPU backend (threads when the layout has several ranks) with a trace into DIR/name.
  static std::string traced_run_in(const fs::path& dir, const std::vector<std::string>& args,
                                   const std::string& name) {
    const Layout l = parse(args);
    executor::TrainOptions options;
    options.mock_data = true;
    options.train_iters = 4;
    options.bf16 = true;
    options.lr = 1e-3;
    options.trace.dir = (dir / name).string();
    if (l.config.world_size == 1) {
      executor::RunConfig run = executor::build_run_config(l.model, l.config, options, 0);
      executor::CpuBackend backend(true);
      executor::SingleRankCommunicator communicator(backend);
      std::ostringstream log;
      executor::TrainingRun training(run, backend, communicator, log);
      training.run();
    } else {
      std::ostringstream log;
      executor::train_on_threads(l.model, l.config, options, log);
    }
    executor::RunManifest m;
    m.model_args = args;
    m.command = {"megatune", "train"};
    m.model = l.model.name;
    m.layout = executor::describe_layout(l.model, l.config);
    m.world_size = l.config.world_size;
    m.micro_batch_size = l.config.micro_batch_size;
    m.global_batch_size = l.config.resolved_global_batch_size();
    m.num_microbatches = l.config.num_microbatches();
    m.seq_length = l.model.seq_length;
    m.model_flops_per_iteration = layouts::model_flops_per_iteration(l.model, m.global_batch_size, 1);
    m.device = "cpu";
    m.backend = "cpu (bf16 emulated)";
    m.cluster = "1x" + std::to_string(l.config.world_size) + "xH200";
    m.timing = "host clock";
    m.trace = options.trace;
    executor::resolve_trace_window(m.trace, options.train_iters);
    executor::write_run_manifest(m);
    return options.trace.dir;
  }

  std::string compare(CompareOptions o) {
    std::ostringstream out;
    run_compare(o, out);
    return out.str();
  }

  // The UserError message of run_compare(o); fails when it does not throw one.
  std::string compare_error(CompareOptions o) {
    try {
      compare(o);
    } catch (const UserError& e) {
      const std::string message = e.what();
      EXPECT_EQ(message.find('\n'), std::string::npos) << message;
      return message;
    }
    ADD_FAILURE() << "no UserError for --run " << o.runs.front();
    return "";
  }

  static std::string read(const fs::path& path) {
    std::ifstream in(path);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  }
  static int count(const std::string& text, const std::string& part) {
    int n = 0;
    for (std::size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
    return n;
  }

  fs::path dir_;
};

const std::vector<std::string> kTiny = {"--model", "tiny", "--micro-batch-size", "2", "--global-batch-size",
                                        "4"};

TEST_F(CompareTest, TinyRunJoinsEveryOpAndRendersEveryOutput) {
  const std::string run_dir = traced_run(kTiny, "tiny");
  const calibration::MeasuredRun run = calibration::read_measured_run(run_dir);
  const Layout l = parse(kTiny);
  const layouts::StepProgram program = layouts::build_step_program(l.model, l.config, 0);
  ASSERT_EQ(run.ranks.size(), 1u);
  ASSERT_EQ(run.ranks[0].iterations.size(), 3u);  // the default window 2:3
  EXPECT_EQ(run.ranks[0].iterations[0].iteration, 2);
  EXPECT_GT(run.ranks[0].arena_capacity_bytes, 0);
  for (const calibration::TracedIteration& it : run.ranks[0].iterations) {
    ASSERT_EQ(it.ops.size(), program.ops.size());
    EXPECT_GT(it.step_s, 0.0);
    double total = 0;
    for (std::size_t i = 0; i < it.ops.size(); ++i) {
      const calibration::TracedOp& t = it.ops[i];
      EXPECT_EQ(t.id, static_cast<int>(i));
      EXPECT_EQ(t.kind, layouts::op_kind_name(program.ops[i].kind)) << i;
      EXPECT_EQ(t.label, program.ops[i].label) << i;
      EXPECT_EQ(t.bytes, program.ops[i].bytes) << i;
      EXPECT_EQ(t.text, layouts::to_string(program.ops[i])) << i;
      EXPECT_GE(t.start_s, 0.0);
      EXPECT_GE(t.duration_s(), 0.0);
      if (program.ops[i].kind == layouts::OpKind::kGemm) {
        EXPECT_GT(t.duration_s(), 0.0) << i;
      }
      total += t.duration_s();
    }
    EXPECT_GT(total, 0.0);
    EXPECT_LE(total, it.step_s * 1.01);
  }
  EXPECT_NO_THROW(calibration::check_join(run, l.model, l.config));

  CompareOptions o;
  o.runs = {run_dir};
  o.html = (dir_ / "report.html").string();
  o.perfetto = (dir_ / "trace.json").string();
  const std::string table = compare(o);
  for (const char* row : {"step time", "MFU", "pipeline bubble", "exposed comm", "measured arena",
                          "executor sizing", "memory model (Megatron)", "rank 0: per op kind", "gemm",
                          "attention_fwd", "all ops", "worst ops first"})
    EXPECT_NE(table.find(row), std::string::npos) << row << "\n" << table;
  // The executor's own sizing predicts the CPU arena exactly.
  EXPECT_NE(table.find("the executor sizing predicts the measured arena exactly"), std::string::npos)
      << table;

  const std::string html = read(o.html);
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.find("</html>"), std::string::npos);
  EXPECT_GE(count(html, "<svg"), 3);  // per-kind bars, timelines, memory
  for (const char* tag : {"svg", "table", "text", "title", "h2", "p"})
    EXPECT_EQ(count(html, std::string("<") + tag + (std::string(tag) == "p" ? ">" : "")) +
                  (std::string(tag) == "p" ? count(html, "<p ") : 0),
              count(html, std::string("</") + tag + ">"))
        << tag;
  EXPECT_EQ(html.find("http://", 0) == std::string::npos ||
                html.find("http://") == html.find("http://www.w3.org/2000/svg"),
            true)
      << "the report must fetch nothing";
  EXPECT_EQ(html.find("<script"), std::string::npos);

  const nlohmann::json trace = nlohmann::json::parse(read(o.perfetto));
  int predicted = 0, measured = 0;
  std::set<std::string> names;
  for (const nlohmann::json& e : trace.at("traceEvents")) {
    if (e.at("ph") == "M" && e.at("name") == "process_name")
      names.insert(e.at("args").at("name").get<std::string>());
    if (e.at("ph") != "X") continue;
    EXPECT_GE(e.at("dur").get<double>(), 0.0);
    (e.at("pid").get<int>() == 0 ? predicted : measured) += 1;
  }
  EXPECT_EQ(measured, static_cast<int>(program.ops.size()));
  EXPECT_EQ(predicted, static_cast<int>(program.ops.size()));
  EXPECT_EQ(names.size(), 2u);

  if (!fs::exists("/usr/bin/chromium"))
    GTEST_SKIP() << "no /usr/bin/chromium: the HTML is not checked in a browser";
  const fs::path profile = dir_ / "chromium-profile";
  const std::string command =
      "/usr/bin/chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run "
      "--disable-background-networking --disable-component-update --disable-sync --user-data-dir=" +
      profile.string() + " --dump-dom file://" + o.html + " 2>/dev/null";
  FILE* pipe = ::popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string dom;
  char buffer[4096];
  for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) dom.append(buffer, n);
  EXPECT_EQ(::pclose(pipe), 0);
  EXPECT_NE(dom.find("Predicted vs measured"), std::string::npos);
  EXPECT_GE(count(dom, "<svg"), 3);
  EXPECT_EQ(count(dom, "<rect"), count(html, "<rect"));  // the browser parsed every plot element
}

TEST_F(CompareTest, ParallelLayoutOnThreadsJoinsEveryRank) {
  const std::vector<std::string> args = {"--model", "tiny",  "--tp", "2",     "--pp",
                                         "2",       "--mbs", "1",    "--gbs", "4"};
  const std::string run_dir = traced_run(args, "tp2pp2");
  CompareOptions o;
  o.runs = {run_dir};
  o.perfetto = (dir_ / "trace.json").string();
  const std::string table = compare(o);
  for (int r = 0; r < 4; ++r)
    EXPECT_NE(table.find("rank " + std::to_string(r) + ": per op kind"), std::string::npos) << table;
  EXPECT_NE(table.find("all_reduce"), std::string::npos);
  EXPECT_NE(table.find("send"), std::string::npos);
  EXPECT_NE(table.find("the executor sizing predicts the measured arena exactly"), std::string::npos)
      << table;
  EXPECT_EQ(table.find("not in the step program"), std::string::npos) << table;  // every op joined
  const nlohmann::json trace = nlohmann::json::parse(read(o.perfetto));
  std::set<int> pids;
  for (const nlohmann::json& e : trace.at("traceEvents"))
    if (e.at("ph") == "X") pids.insert(e.at("pid").get<int>());
  EXPECT_EQ(pids.size(), 8u);  // predicted and measured of 4 ranks

  // Communication on CPU threads is timed: a receive lasts until its peer has sent, far longer than an empty
  // bracket. Which rank waits depends on the scheduler (on a loaded host the sender can be the late one), but
  // the pipeline makes some rank wait: the longest receive of the first iteration, over all ranks, shows it.
  const calibration::MeasuredRun measured = calibration::read_measured_run(run_dir);
  double longest_recv_s = 0;
  int recvs = 0;
  for (const calibration::TracedRank& rank : measured.ranks)
    for (const calibration::TracedOp& op : rank.iterations.front().ops)
      if (op.kind == "recv") {
        ++recvs;
        EXPECT_GE(op.duration_s(), 0.0) << "rank " << rank.rank;
        longest_recv_s = std::max(longest_recv_s, op.duration_s());
      }
  EXPECT_GT(recvs, 0);
  EXPECT_GT(longest_recv_s, 5e-6);

  // --save: one run per rank, every op with both times.
  const std::string db = (dir_ / "runs.db").string();
  cost_models::open_cost_database(db);
  o.db = db;
  o.save = true;
  o.perfetto.clear();
  EXPECT_NE(compare(o).find("saved 4 runs"), std::string::npos);
  cost_models::Database database = cost_models::open_cost_database(db);
  const std::vector<cost_models::RunRecord> runs = cost_models::load_runs(database);
  ASSERT_EQ(runs.size(), 4u);
  const Layout l = parse(args);
  for (std::size_t r = 0; r < runs.size(); ++r) {
    EXPECT_GT(runs[r].measured_step_time_s, 0.0);
    const std::vector<cost_models::RunOp> ops = cost_models::load_run_ops(database, runs[r].id);
    const layouts::StepProgram program = layouts::build_step_program(l.model, l.config, static_cast<int>(r));
    ASSERT_EQ(ops.size(), program.ops.size());
    for (const cost_models::RunOp& op : ops)
      EXPECT_EQ(op.op_text, layouts::to_string(program.ops.at(op.op_id)));
  }
}

TEST_F(CompareTest, SeveralRunsGiveTheErrorPerLayout) {
  CompareOptions o;
  o.runs = {traced_run(kTiny, "mbs2"), traced_run({"--model", "tiny", "--mbs", "1", "--gbs", "4"}, "mbs1")};
  o.html = (dir_ / "runs.html").string();
  o.top = 0;
  const std::string table = compare(o);
  EXPECT_NE(table.find("per run (error"), std::string::npos) << table;
  EXPECT_NE(table.find("Kendall tau"), std::string::npos) << table;
  const std::string html = read(o.html);
  EXPECT_NE(html.find("Predicted vs measured: 2 runs"), std::string::npos);
  EXPECT_NE(html.find("class=\"errors\""), std::string::npos);
  EXPECT_EQ(count(html, "<svg"), count(html, "</svg>"));
  o.perfetto = (dir_ / "t.json").string();
  EXPECT_NE(compare_error(o).find("take one --run"), std::string::npos);
}

TEST_F(CompareTest, BadInputsGiveOneClearLine) {
  CompareOptions o;
  o.runs = {(dir_ / "missing").string()};
  EXPECT_NE(compare_error(o).find("no such directory"), std::string::npos);

  std::ofstream((dir_ / "file").string()) << "x";
  o.runs = {(dir_ / "file").string()};
  EXPECT_NE(compare_error(o).find("not a directory"), std::string::npos);

  fs::create_directories(dir_ / "empty");
  o.runs = {(dir_ / "empty").string()};
  EXPECT_NE(compare_error(o).find("run.json does not exist"), std::string::npos);

  fs::create_directories(dir_ / "corrupt");
  std::ofstream((dir_ / "corrupt" / "run.json").string()) << "{\"format\": ";
  o.runs = {(dir_ / "corrupt").string()};
  EXPECT_NE(compare_error(o).find("corrupt trace"), std::string::npos);

  fs::create_directories(dir_ / "fifo");
  ASSERT_EQ(::mkfifo((dir_ / "fifo" / "run.json").c_str(), 0600), 0);
  o.runs = {(dir_ / "fifo").string()};
  EXPECT_NE(compare_error(o).find("not a regular file"), std::string::npos);

  const std::string good = traced_run(kTiny, "tiny");
  o.runs = {good};
  o.simulate_args = "--model tiny --mbs 1 --gbs 4";  // another layout: four micro-batches
  EXPECT_NE(compare_error(o).find("another model or layout"), std::string::npos);
  o.simulate_args = "--model gpt-125m --mbs 2 --gbs 4";
  EXPECT_NE(compare_error(o).find("another model or layout"), std::string::npos);
  o.simulate_args = "--model no-such-model";
  EXPECT_FALSE(compare_error(o).empty());
  o.simulate_args.clear();
  o.plan = (dir_ / "no-plan.json").string();
  EXPECT_NE(compare_error(o).find("--plan"), std::string::npos);
  o.plan.clear();
  o.cluster = "1x8xH200";
  EXPECT_NE(compare_error(o).find("--cluster"), std::string::npos);
  o.cluster.clear();

  // A rank file cut in the middle of a line.
  const fs::path rank_file = fs::path(good) / "rank_0.ops.jsonl";
  std::string text = read(rank_file);
  // Cut one character before a line's end, so that the last line is always incomplete (a cut at exactly half
  // the file may fall on a line boundary, depending on the measured times' digits).
  std::size_t cut = text.find('\n', text.size() / 2);
  cut = cut == std::string::npos ? text.size() - 1 : cut - 1;
  std::ofstream(rank_file.string(), std::ios::trunc) << text.substr(0, cut);
  EXPECT_NE(compare_error(o).find("rank_0.ops.jsonl line"), std::string::npos);
  fs::remove(rank_file);
  EXPECT_NE(compare_error(o).find("rank_0.ops.jsonl does not exist"), std::string::npos);
}

// One traced run made once; each test edits a copy of it the way a hand or a broken tool would, and the
// copy must be refused in one line naming what is wrong before anything is compared.
class TamperedTraceTest : public CompareTest {
 protected:
  static void SetUpTestSuite() {
    source_ =
        new fs::path(fs::temp_directory_path() / ("megatune_tampered_trace_" + std::to_string(::getpid())));
    fs::remove_all(*source_);
    fs::create_directories(*source_);
    traced_run_in(*source_, kTiny, "run");
  }
  static void TearDownTestSuite() {
    fs::remove_all(*source_);
    delete source_;
  }
  // A fresh copy of the traced run; its run.json and rank file are edited through the functions below.
  std::string copy() {
    const fs::path run = dir_ / "run";
    fs::copy(*source_ / "run", run, fs::copy_options::recursive);
    return run.string();
  }
  static void edit_manifest(const std::string& run, const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json manifest = nlohmann::json::parse(read(fs::path(run) / "run.json"));
    edit(manifest);
    std::ofstream((fs::path(run) / "run.json").string(), std::ios::trunc) << manifest.dump(1);
  }
  // Calls `edit` on each line of rank 0's file (as JSON); a line it empties is dropped.
  static void edit_rank_lines(const std::string& run, const std::function<void(nlohmann::json&)>& edit) {
    const fs::path file = fs::path(run) / "rank_0.ops.jsonl";
    std::istringstream in(read(file));
    std::string out;
    for (std::string line; std::getline(in, line);) {
      nlohmann::json value = nlohmann::json::parse(line);
      edit(value);
      if (!value.is_null()) out += value.dump() + "\n";
    }
    std::ofstream(file.string(), std::ios::trunc) << out;
  }
  std::string refusal(const std::string& run) {
    CompareOptions o;
    o.runs = {run};
    return compare_error(o);
  }

  static fs::path* source_;
};
fs::path* TamperedTraceTest::source_ = nullptr;

TEST_F(TamperedTraceTest, TheUntouchedCopyIsCompared) {
  CompareOptions o;
  o.runs = {copy()};
  o.top = 0;
  EXPECT_NE(compare(o).find("step time"), std::string::npos);
}

TEST_F(TamperedTraceTest, AnEditedModelLabelIsRefused) {
  const std::string run = copy();
  edit_manifest(run, [](nlohmann::json& m) { m["model"] = "gpt-125m"; });
  const std::string message = refusal(run);
  EXPECT_NE(message.find("run.json records model 'gpt-125m', its model_args build 'tiny'"), std::string::npos)
      << message;
}

TEST_F(TamperedTraceTest, FlagsTheOpsDoNotFollowAreRefused) {
  // Full recomputation changes neither the name, the layout nor the FLOPs, only the ops.
  const std::string run = copy();
  edit_manifest(run, [](nlohmann::json& m) {
    for (const char* word :
         {"--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"})
      m["model_args"].push_back(word);
  });
  const std::string message = refusal(run);
  EXPECT_NE(message.find("does not match the model and layout its run.json records"), std::string::npos)
      << message;
}

TEST_F(TamperedTraceTest, EveryRecordedFieldMustMatchTheFlags) {
  const std::vector<std::pair<std::string, nlohmann::json>> edits = {
      {"layout", "tp2 pp1 dp1 cp1 vpp1 layout Et*2L"},
      {"micro_batch_size", 1},
      {"global_batch_size", 8},
      {"model_flops_per_iteration", 1e9}};
  for (const auto& [field, value] : edits) {
    fs::remove_all(dir_ / "run");
    const std::string run = copy();
    edit_manifest(run, [&](nlohmann::json& m) { m[field] = value; });
    EXPECT_NE(refusal(run).find("run.json records " + field), std::string::npos) << field;
  }
}

TEST_F(TamperedTraceTest, ARankListedTwiceIsRefused) {
  const std::string run = copy();
  edit_manifest(run, [](nlohmann::json& m) { m["ranks"].push_back(m["ranks"][0]); });
  EXPECT_NE(refusal(run).find("lists rank 0 twice"), std::string::npos);
  edit_manifest(run, [](nlohmann::json& m) {
    m["world_size"] = 2;
    m["ranks"][1]["rank"] = 1;
  });
  EXPECT_NE(refusal(run).find("lists rank file rank_0.ops.jsonl twice"), std::string::npos);
}

TEST_F(TamperedTraceTest, AnOpEndingBeforeItStartsIsRefusedNamingTheFileAndOp) {
  const std::string run = copy();
  edit_rank_lines(run, [](nlohmann::json& line) {
    if (line["record"] == "op" && line["id"] == 3) line["end_s"] = line["start_s"].get<double>() - 60;
  });
  const std::string message = refusal(run);
  EXPECT_NE(message.find("rank_0.ops.jsonl line"), std::string::npos) << message;
  EXPECT_NE(message.find("op 3 ("), std::string::npos) << message;
  EXPECT_NE(message.find("ends before it starts"), std::string::npos) << message;
}

TEST_F(TamperedTraceTest, ANegativeStepTimeIsRefused) {
  const std::string run = copy();
  edit_rank_lines(run, [](nlohmann::json& line) {
    if (line["record"] == "iteration") line["step_s"] = -0.5;
  });
  EXPECT_NE(refusal(run).find("not a positive step time"), std::string::npos);
}

TEST_F(TamperedTraceTest, AMissingOpLineIsRefusedByTheRecordedCount) {
  const std::string run = copy();
  edit_rank_lines(run, [](nlohmann::json& line) {
    if (line["record"] != "op" || line["id"] < 5) return;
    if (line["id"] == 5)
      line = nullptr;
    else
      line["id"] = line["id"].get<int>() - 1;
  });
  const std::string message = refusal(run);
  EXPECT_NE(message.find("op lines: a truncated or edited trace"), std::string::npos) << message;
}

TEST_F(TamperedTraceTest, ARankTheRunDoesNotHaveIsRefused) {
  CompareOptions o;
  o.runs = {copy()};
  o.rank = 5;
  EXPECT_NE(compare_error(o).find("--rank 5: --run " + o.runs.front() + " traced ranks 0 to 0"),
            std::string::npos);
}

TEST_F(TamperedTraceTest, ARunGivenTwiceIsRefused) {
  CompareOptions o;
  o.runs = {copy()};
  o.runs.push_back(o.runs.front() + "/");
  EXPECT_NE(compare_error(o).find("is given twice"), std::string::npos);
  o.leave_one_out = true;
  EXPECT_NE(compare_error(o).find("is given twice"), std::string::npos);
}

// A trace of rank 0 of `l` as the executor writes it when it issued exactly the step program.
calibration::MeasuredRun trace_of_program(const Layout& l) {
  calibration::MeasuredRun run;
  run.dir = "moe";
  run.device = "cuda";
  run.world_size = l.config.world_size;
  calibration::TracedRank rank;
  calibration::TracedIteration it;
  for (const layouts::Op& op : layouts::build_step_program(l.model, l.config, 0).ops) {
    calibration::TracedOp t;
    t.kind = layouts::op_kind_name(op.kind);
    t.phase = layouts::op_phase_name(op.phase);
    t.dtype = std::array{"bf16", "fp16", "fp32", "fp8"}[static_cast<int>(op.dtype)];
    t.label = op.label;
    t.layer = op.layer, t.microbatch = op.microbatch, t.m = op.m, t.n = op.n, t.k = op.k;
    t.accumulate = op.accumulate;
    t.attention = {op.attention.batch,  op.attention.heads,           op.attention.kv_heads,
                   op.attention.seq_q,  op.attention.seq_kv,          op.attention.head_dim,
                   op.attention.causal, op.attention.value_head_dim()};
    t.bytes = op.bytes;
    t.group = layouts::comm_group_name(op.group);
    t.group_size = op.group_size;
    it.ops.push_back(t);
  }
  rank.iterations.push_back(it);
  run.ranks.push_back(rank);
  return run;
}

TEST(CheckJoin, ExpertRowsOfAnotherCountAreNamedAsRouting) {
  const Layout l = parse({"--model", "tiny-mixtral", "--ep", "2", "--dp", "2", "--mbs", "1", "--gbs", "4"});
  calibration::MeasuredRun run = trace_of_program(l);
  EXPECT_NO_THROW(calibration::check_join(run, l.model, l.config));
  auto& ops = run.ranks[0].iterations[0].ops;
  const auto expert = std::find_if(ops.begin(), ops.end(), [](const calibration::TracedOp& op) {
    return op.kind == "gemm" && op.label.rfind("expert", 0) == 0;
  });
  ASSERT_NE(expert, ops.end());
  expert->m += 2;  // two more tokens routed here than the balanced share
  try {
    calibration::check_join(run, l.model, l.config, calibration::JoinTarget::kRunFlags);
    FAIL() << "no UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("not the step program's balanced share"), std::string::npos)
        << e.what();
    EXPECT_EQ(std::string(e.what()).find("edited"), std::string::npos) << e.what();
  }
}

TEST(TraceWindow, ParsesAndChecksTheWindow) {
  executor::RunTraceOptions t;
  t.dir = "d";
  executor::parse_trace_iterations("3:2", t);
  EXPECT_EQ(t.first_iteration, 3);
  EXPECT_EQ(t.iterations, 2);
  EXPECT_NO_THROW(executor::resolve_trace_window(t, 4));
  EXPECT_THROW(executor::resolve_trace_window(t, 3), UserError);
  for (const char* bad : {"3", "a:2", "0:1", "2:0", "2:3x", ""})
    EXPECT_THROW(executor::parse_trace_iterations(bad, t), UserError) << bad;
  executor::RunTraceOptions defaults;
  defaults.dir = "d";
  executor::resolve_trace_window(defaults, 1);
  EXPECT_EQ(defaults.first_iteration, 1);
  EXPECT_EQ(defaults.iterations, 1);
  defaults.first_iteration = 0;
  executor::resolve_trace_window(defaults, 10);
  EXPECT_EQ(defaults.first_iteration, 2);
  EXPECT_EQ(defaults.iterations, 3);
}

}  // namespace
}  // namespace megatune::tools
