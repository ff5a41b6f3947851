// `megatune db calibrate` and `megatune compare --leave-one-out` on CPU traced runs made here: the
// calibration lands in the database with its provenance, simulate prices with it by default and says so,
// --no-calibration leaves it out, and bad inputs get one clear line.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli_harness.h"
#include "cost_models/calibration_store.h"
#include "cost_models/cost_database.h"

namespace megatune::tests {
namespace {

class CalibrateTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    for (const char* mbs : {"1", "2"}) {
      const CliResult r = run_megatune(
          {"train", "--device", "cpu", "--model", "tiny", "--mock-data", "--bf16", "--train-iters", "4",
           "--gbs", "4", "--mbs", mbs, "--lr", "1e-3", "--trace-dir", *dir_ / (std::string("mbs") + mbs)},
          60);
      ASSERT_EQ(r.exit_code, 0) << r.err;
    }
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string path(const std::string& name) { return *dir_ / name; }

  // The step time that `megatune simulate` prints (s, 3 decimals: so simulate many micro-batches).
  static double simulated_step_s(const std::string& out) {
    const std::size_t at = out.find("step time");
    return at == std::string::npos ? -1.0 : std::stod(out.substr(out.find_first_of("0123456789", at)));
  }

  static TempDir* dir_;
};
TempDir* CalibrateTest::dir_ = nullptr;

TEST_F(CalibrateTest, StoresTheCalibrationWithProvenanceAndSimulateUsesItByDefault) {
  const std::string db = path("cal.db");
  const CliResult calibrate = run_megatune(
      {"db", "--db", db, "calibrate", "--run", path("mbs1"), "--run", path("mbs2"), "--cluster", "1x1xH200"});
  ASSERT_EQ(calibrate.exit_code, 0) << calibrate.err;
  EXPECT_NE(calibrate.out.find("calibrated H200 SXM from 2 traced runs"), std::string::npos) << calibrate.out;
  EXPECT_NE(calibrate.out.find("gemm"), std::string::npos);

  {
    cost_models::Database database = cost_models::open_cost_database(db);
    // A new database starts with the shipped data (its H200 calibration too); ours is the newest row.
    const std::vector<cost_models::CalibrationRecord> rows = cost_models::load_calibrations(database);
    ASSERT_FALSE(rows.empty());
    const cost_models::CalibrationRecord& row = rows.back();
    EXPECT_EQ(row.gpu, "H200 SXM");
    EXPECT_EQ(row.n_runs, 2);
    EXPECT_GT(row.n_ops, 0);
    // H200 prices are far below CPU op times; the calibrated error is recorded too (its size depends on
    // how noisy the CPU's op times were).
    EXPECT_GT(row.op_error_before, 0.5);
    EXPECT_GE(row.op_error_after, 0.0);
    const nlohmann::json runs = nlohmann::json::parse(row.runs_json);
    ASSERT_EQ(runs.size(), 2u);
    EXPECT_EQ(runs[0].at("run"), path("mbs1"));
    EXPECT_EQ(runs[0].at("device"), "cpu");
    EXPECT_TRUE(runs[0].contains("sm_clock_mhz"));
    EXPECT_TRUE(runs[0].contains("created_utc"));
    EXPECT_FALSE(runs[0].at("megatune_commit").get<std::string>().empty());  // the build's commit
  }

  const std::vector<std::string> simulate = {"simulate", "--db",  db,   "--model", "tiny", "--cluster",
                                             "1x1xH200", "--gbs", "64", "--mbs",   "1"};
  const CliResult calibrated = run_megatune(simulate);
  ASSERT_EQ(calibrated.exit_code, 0) << calibrated.err;
  EXPECT_NE(calibrated.out.find("calibrated from 2 traced runs"), std::string::npos) << calibrated.out;
  std::vector<std::string> off = simulate;
  off.push_back("--no-calibration");
  const CliResult uncalibrated = run_megatune(off);
  ASSERT_EQ(uncalibrated.exit_code, 0) << uncalibrated.err;
  EXPECT_NE(uncalibrated.out.find("calibration off"), std::string::npos) << uncalibrated.out;
  // CPU ops are far slower than H200 prices: the calibrated prediction is much longer (4-7x here, depending
  // on how loaded the machine was when the runs were traced).
  EXPECT_GT(simulated_step_s(calibrated.out), 2 * simulated_step_s(uncalibrated.out));
}

TEST_F(CalibrateTest, LeaveOneOutPrintsEveryRunBeforeAndAfter) {
  const CliResult r = run_megatune(
      {"compare", "--leave-one-out", "--run", path("mbs1"), "--run", path("mbs2"), "--db", path("loo.db")});
  // --db must exist for compare: it prices from a database it does not create.
  EXPECT_NE(r.exit_code, 0);
  const CliResult embedded =
      run_megatune({"compare", "--leave-one-out", "--run", path("mbs1"), "--run", path("mbs2")});
  ASSERT_EQ(embedded.exit_code, 0) << embedded.err;
  EXPECT_NE(embedded.out.find("mbs1"), std::string::npos);
  EXPECT_NE(embedded.out.find("mbs2"), std::string::npos);
  EXPECT_NE(embedded.out.find("calibrated (leave-one-out): mean"), std::string::npos) << embedded.out;
}

TEST_F(CalibrateTest, AnUnreadableStoredCalibrationIsOneLineNamingTheFix) {
  const std::string db = path("broken.db");
  {
    cost_models::Database database = cost_models::open_cost_database(db);
    cost_models::CalibrationRecord row;
    row.gpu = "H200 SXM";
    row.params_json = "{\"classes\": 7}";
    cost_models::insert_calibration(database, row);
  }
  const std::vector<std::string> simulate = {"simulate",  "--db",     db,      "--model", "tiny",
                                             "--cluster", "1x1xH200", "--gbs", "4"};
  const CliResult r = run_megatune(simulate);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.error_lines(), 1) << r.err;
  EXPECT_NE(r.err.find("--no-calibration"), std::string::npos) << r.err;
  std::vector<std::string> off = simulate;
  off.push_back("--no-calibration");
  EXPECT_EQ(run_megatune(off).exit_code, 0);
}

TEST_F(CalibrateTest, BadInputsGiveOneClearLine) {
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{"db", "--db", path("x.db"), "calibrate", "--run", path("mbs1")}, "is a CPU run"},
      {{"db", "calibrate", "--run", path("mbs1"), "--cluster", "1x1xH200"}, "is a CPU run"},
      {{"db", "--db", path("x.db"), "calibrate", "--run", path("missing"), "--cluster", "1x1xH200"},
       "no such directory"},
      {{"db", "--embedded", "calibrate", "--run", path("mbs1")}, "--embedded"},
      {{"compare", "--leave-one-out", "--run", path("mbs1")}, "at least two --run"},
      // A run given twice would be weighted twice (or predicted from itself).
      {{"db", "--db", path("x.db"), "calibrate", "--run", path("mbs1"), "--run", path("mbs1"), "--cluster",
        "1x1xH200"},
       "--run " + path("mbs1") + " is given twice"},
      {{"db", "--db", path("x.db"), "calibrate", "--run", path("mbs1"), "--run", path("mbs1") + "/",
        "--cluster", "1x1xH200"},
       "is given twice (also as " + path("mbs1") + ")"},
      {{"compare", "--leave-one-out", "--run", path("mbs1"), "--run", path("mbs2"), "--run", path("mbs1")},
       "is given twice"},
      {{"compare", "--run", path("mbs1"), "--rank", "5"},
       "--rank 5: --run " + path("mbs1") + " traced ranks 0 to 0"},
      {{"compare", "--run", path("mbs1"), "--rank", "-1"}, "--rank"},
  };
  for (const Case& c : cases) {
    const CliResult r = run_megatune(c.args);
    EXPECT_NE(r.exit_code, 0) << c.args.back();
    EXPECT_EQ(r.error_lines(), 1) << r.err;
    EXPECT_NE(r.err.find(c.says), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find(".cpp"), std::string::npos) << r.err;
  }
}

}  // namespace
}  // namespace megatune::tests
