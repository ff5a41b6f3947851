// `megatune plan --measure-top K` on the CPU backend: the top candidates are trained and traced, the table
// shows their measured step times, the re-ranked winner is the fastest measured one and the written plan
// names it, and the calibration lands in the --db named; failing candidates and bad flags get one line each;
// SIGTERM to the plan ends its running `megatune train` child too.
#include <dirent.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "cli_harness.h"
#include "cost_models/calibration_store.h"
#include "cost_models/cost_database.h"
#include "tools/measure_top.h"

namespace megatune::tests {
namespace {

std::vector<std::string> measure_plan(const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"plan",     "--model",
                                   "tiny",     "--cluster",
                                   "1x2xH100", "--gbs",
                                   "8",        "--top-k",
                                   "4",        "--threads",
                                   "2",        "--measure-top",
                                   "2",        "--measure-device",
                                   "cpu",      "--measure-iterations",
                                   "3"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

struct RerankedRow {
  int plan_rank = 0;
  std::string candidate;
  double measured_s = 0;
};

// The rows of the "re-ranked by measured step time" table: rank, plan rank, candidate words, measured.
std::vector<RerankedRow> reranked_rows(const std::string& out) {
  std::vector<RerankedRow> rows;
  std::istringstream in(out.substr(out.find("re-ranked by measured step time")));
  std::string line;
  std::getline(in, line);  // title
  std::getline(in, line);  // header
  while (std::getline(in, line) && !line.empty()) {
    std::istringstream words(line);
    RerankedRow row;
    int rank = 0;
    words >> rank >> row.plan_rank;
    for (std::string w; words >> w && w.find_first_not_of("0123456789.") != std::string::npos;)
      row.candidate += (row.candidate.empty() ? "" : " ") + w;
    std::istringstream measured(line.substr(line.find(row.candidate) + row.candidate.size()));
    measured >> row.measured_s;
    rows.push_back(row);
  }
  return rows;
}

TEST(PlanMeasureTopTest, MeasuresTheTopCandidatesAndMakesTheFastestMeasuredOneTheWinner) {
  TempDir dir;
  const std::string plan = dir / "plan.json";
  const std::string db = dir / "measured.db";
  ASSERT_EQ(run_megatune({"db", "--db", db, "info"}).exit_code, 0);  // a new database of its own
  const CliResult r =
      run_megatune(measure_plan({"-o", plan, "--measure-keep", dir / "runs", "--db", db}), 120);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("predicted vs measured"), std::string::npos) << r.out;
  // Both MFU columns of each measured row carry two decimals.
  const std::regex mfu_columns(R"( [0-9]+\.[0-9]{2}% +[0-9]+\.[0-9]{2}%$)");
  std::istringstream table(r.out.substr(r.out.find("predicted vs measured")));
  int measured_rows = 0;
  for (std::string line; std::getline(table, line) && line.find("re-ranked") == std::string::npos;)
    if (line.find(" s ") != std::string::npos) {
      ++measured_rows;
      EXPECT_TRUE(std::regex_search(line, mfu_columns)) << line;
    }
  EXPECT_EQ(measured_rows, 2) << r.out;
  EXPECT_NE(r.out.find("calibration from 2 traced runs"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("stored as calibrations row"), std::string::npos) << r.out;  // --db named
  {
    cost_models::Database database = cost_models::open_cost_database(db);
    const std::vector<cost_models::CalibrationRecord> rows = cost_models::load_calibrations(database);
    ASSERT_FALSE(rows.empty());
    EXPECT_EQ(rows.back().n_runs, 2);
    EXPECT_EQ(rows.back().gpu, "H100 SXM");
  }
  const std::vector<RerankedRow> rows = reranked_rows(r.out);
  ASSERT_EQ(rows.size(), 2u) << r.out;
  EXPECT_GT(rows[0].measured_s, 0.0);
  EXPECT_LE(rows[0].measured_s, rows[1].measured_s) << r.out;
  EXPECT_NE(rows[0].plan_rank, rows[1].plan_rank);
  EXPECT_NE(r.out.find("winner: " + rows[0].candidate + ","), std::string::npos) << r.out;
  for (const char* run : {"rank1", "rank2"})
    EXPECT_TRUE(std::filesystem::exists(dir / "runs/" + run + "/run.json")) << run;

  const nlohmann::json written = nlohmann::json::parse(read_text(plan));
  const nlohmann::json& p = written.at("plan");
  const std::string knobs =
      "tp" + std::to_string(p.at("tp").get<int>()) + " pp" + std::to_string(p.at("pp").get<int>()) + " vpp" +
      std::to_string(p.at("vpp").get<int>()) + " dp" + std::to_string(p.at("dp").get<int>()) + " cp" +
      std::to_string(p.at("cp").get<int>()) + " ep" + std::to_string(p.at("ep").get<int>()) + " etp" +
      std::to_string(p.at("etp").get<int>()) + " mbs" + std::to_string(p.at("micro_batch_size").get<int>());
  EXPECT_EQ(rows[0].candidate.rfind(knobs, 0), 0u) << knobs << " vs " << rows[0].candidate;
  EXPECT_EQ(written.at("why").get<std::string>().find("fastest measured"), 0u);
  const nlohmann::json& measured = written.at("measured");
  ASSERT_EQ(measured.size(), 2u);
  for (const nlohmann::json& m : measured) {
    EXPECT_GT(m.at("measured_step_time_s").get<double>(), 0.0);
    EXPECT_GT(m.at("calibrated_step_time_s").get<double>(), 0.0);
  }
  EXPECT_EQ(measured[rows[0].plan_rank - 1].at("candidate").get<std::string>(), rows[0].candidate);
}

TEST(PlanMeasureTopTest, TracesTheLastIterationsAfterTheFirst) {
  EXPECT_EQ(tools::measure_trace_window(6), "4:3");
  EXPECT_EQ(tools::measure_trace_window(3), "2:2");
  EXPECT_EQ(tools::measure_trace_window(2), "2:1");
  EXPECT_EQ(tools::measure_trace_window(1), "1:1");
}

TEST(PlanMeasureTopTest, CandidatesThatFailAreReportedOneLineEach) {
  const CliResult r = run_megatune(measure_plan({"--measure-timeout", "0.001"}), 60);
  EXPECT_NE(r.exit_code, 0);
  std::size_t failed = 0;
  for (std::size_t at = r.out.find("failed, dropped"); at != std::string::npos;
       at = r.out.find("failed, dropped", at + 1))
    ++failed;
  EXPECT_EQ(failed, 2u) << r.out;
  EXPECT_NE(r.out.find("--measure-timeout"), std::string::npos) << r.out;
  EXPECT_EQ(r.error_lines(), 1) << r.err;
  EXPECT_NE(r.err.find("none of the 2 candidates ran"), std::string::npos) << r.err;
}

TEST(PlanMeasureTopTest, BadMeasureFlagsGetOneLine) {
  const CliResult device = run_megatune(measure_plan({"--measure-device", "tpu"}));
  EXPECT_NE(device.exit_code, 0);
  EXPECT_EQ(device.error_lines(), 1) << device.err;
  EXPECT_NE(device.err.find("--measure-device"), std::string::npos) << device.err;
#ifndef MEGATUNE_HAVE_CUDA
  const CliResult cuda =
      run_megatune({"plan", "--model", "tiny", "--cluster", "1x2xH100", "--gbs", "8", "--measure-top", "2"});
  EXPECT_NE(cuda.exit_code, 0);
  EXPECT_EQ(cuda.error_lines(), 1) << cuda.err;
  EXPECT_NE(cuda.err.find("use --measure-device cpu"), std::string::npos) << cuda.err;
#endif
  const CliResult keep = run_megatune(
      {"plan", "--model", "tiny", "--cluster", "1x2xH100", "--gbs", "8", "--measure-keep", "runs"});
  EXPECT_NE(keep.exit_code, 0);
  EXPECT_EQ(keep.error_lines(), 1) << keep.err;
  EXPECT_NE(keep.err.find("--measure-keep needs --measure-top"), std::string::npos) << keep.err;
}

// The pids whose parent is `parent` (from /proc/<pid>/stat).
std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> children;
  DIR* proc = ::opendir("/proc");
  for (dirent* entry = proc ? ::readdir(proc) : nullptr; entry != nullptr; entry = ::readdir(proc)) {
    const std::string name = entry->d_name;
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;  // not a process
    char stat_text[512] = {};
    const int fd = ::open(("/proc/" + name + "/stat").c_str(), O_RDONLY);
    if (fd < 0) continue;  // ended meanwhile
    const ssize_t got = ::read(fd, stat_text, sizeof(stat_text) - 1);
    ::close(fd);
    const std::string stat(stat_text, got > 0 ? static_cast<std::size_t>(got) : 0);
    const std::size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(stat.substr(close + 1));
    std::string state;
    pid_t ppid = 0;
    fields >> state >> ppid;
    if (ppid == parent) children.push_back(static_cast<pid_t>(std::stol(name)));
  }
  if (proc) ::closedir(proc);
  return children;
}

TEST(PlanMeasureTopTest, SigtermToThePlanEndsItsTrainingChild) {
  TempDir dir;
  std::vector<std::string> words = measure_plan({});
  const auto iterations = std::find(words.begin(), words.end(), "--measure-iterations");
  ASSERT_NE(iterations, words.end());
  *(iterations + 1) = "1000000";  // a child that trains far longer than the test
  words.insert(words.begin(), MEGATUNE_CLI_PATH);
  const std::string err_path = dir / "err";
  const pid_t plan = start_process(words, "/dev/null", err_path);
  std::vector<pid_t> children;
  const auto start = std::chrono::steady_clock::now();
  while (children.empty() && std::chrono::steady_clock::now() - start < std::chrono::seconds(30)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    children = children_of(plan);
  }
  ASSERT_EQ(children.size(), 1u) << "the plan started no training child";
  ::kill(plan, SIGTERM);
  int status = 0;
  ASSERT_EQ(::waitpid(plan, &status, 0), plan);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGTERM) << status;
  // Reaped by the plan before it ended: the child's pid no longer names a process (nor a zombie).
  EXPECT_NE(::kill(children[0], 0), 0);
  EXPECT_EQ(errno, ESRCH);
  const std::string err = read_text(err_path);
  EXPECT_NE(err.find("interrupted by signal Terminated: stopped its running child, megatune train"),
            std::string::npos)
      << err;
}

}  // namespace
}  // namespace megatune::tests
