// What a hostile but realistic user sees from `megatune`, class by class: no crash on huge thread counts,
// no hang on FIFOs or directories given as files, no lost outputs when a write fails, no silently accepted
// NaN / zero / negative / absurd values, and every error one line without internal source locations.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <regex>

#include "cost_models/cost_database.h"
#include "cost_models/hardware_catalog.h"
#include "tests/tools/cli_harness.h"
#include "tests/tools/plan_dry_run.h"

namespace megatune::tests {
namespace {

const std::vector<std::string> kSmallPlan = {"plan",  "--model", "llama3-8b",    "--cluster", "1x8xH100",
                                             "--gbs", "64",      "--seq-length", "2048"};

std::vector<std::string> with(std::vector<std::string> base, const std::vector<std::string>& more) {
  base.insert(base.end(), more.begin(), more.end());
  return base;
}

bool has_source_location(const std::string& text) {
  static const std::regex location(R"([A-Za-z_]+\.(cpp|cu|h|cuh|hpp):[0-9]+)");
  return std::regex_search(text, location);
}

// A refused input: non-zero exit, no signal, no hang, one line on stderr without file:line.
void expect_one_line_refusal(const CliResult& r, const std::string& must_mention) {
  EXPECT_FALSE(r.timed_out) << "hung: " << r.err;
  EXPECT_EQ(r.signal, 0) << "crashed: " << r.err;
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_NE(r.exit_code, -1) << r.err;
  EXPECT_EQ(r.error_lines(), 1) << r.err;
  EXPECT_FALSE(has_source_location(r.err)) << r.err;
  EXPECT_EQ(r.err.find("terminate"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(must_mention), std::string::npos) << "expected '" << must_mention << "' in: " << r.err;
}

// ---- crash ----

TEST(CliCrash, HugeThreadCountIsCappedNotAborted) {
  const CliResult r = run_megatune(with(kSmallPlan, {"--threads", "100000"}), 120);
  EXPECT_EQ(r.signal, 0) << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("capped"), std::string::npos) << r.err;
}

// ---- hang: a FIFO (or a directory) where a file is expected fails within a second ----

class CliFifo : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(::mkfifo(fifo_.c_str(), 0644), 0); }
  TempDir dir_;
  std::string fifo_ = dir_ / "input.json";
};

TEST_F(CliFifo, ClusterFile) {
  const CliResult r = run_megatune({"plan", "--model", "llama3-8b", "--cluster", fifo_, "--gbs", "64"}, 5);
  expect_one_line_refusal(r, "FIFO");
  EXPECT_LT(r.seconds, 2.0);
}

TEST_F(CliFifo, DbImportFile) {
  const CliResult r =
      run_megatune({"db", "--db", dir_ / "c.db", "import", fifo_, "--table", "gpu_models"}, 5);
  expect_one_line_refusal(r, "FIFO");
  EXPECT_LT(r.seconds, 2.0);
}

TEST_F(CliFifo, CostDatabase) {
  const CliResult r = run_megatune({"db", "--db", fifo_, "info"}, 5);
  expect_one_line_refusal(r, "not a regular file");
}

TEST_F(CliFifo, DatasetFiles) {
  ASSERT_EQ(::mkfifo((dir_ / "ds.idx").c_str(), 0644), 0);
  ASSERT_EQ(::mkfifo((dir_ / "ds.bin").c_str(), 0644), 0);
  const CliResult r = run_megatune({"data", "info", dir_ / "ds"}, 5);
  expect_one_line_refusal(r, "FIFO");
  EXPECT_LT(r.seconds, 2.0);
}

TEST_F(CliFifo, PreprocessInput) {
  const CliResult r =
      run_megatune({"data", "preprocess", "--input", fifo_, "--output-prefix", dir_ / "o"}, 5);
  expect_one_line_refusal(r, "--input " + fifo_ + " is a FIFO");
  const CliResult directory =
      run_megatune({"data", "preprocess", "--input", dir_.path(), "--output-prefix", dir_ / "o"}, 5);
  expect_one_line_refusal(directory, "is a directory");
}

TEST_F(CliFifo, OutputFifoWithoutReaderFailsInsteadOfBlocking) {
  const CliResult r = run_megatune(
      {"db", "--embedded", "export", "--table", "gpu_models", "--format", "csv", "-o", fifo_}, 5);
  expect_one_line_refusal(r, "no process reads");
}

TEST(CliDirectoryAsFile, ClusterDirectoryIsNamedAsADirectory) {
  TempDir dir;
  std::filesystem::create_directory(dir / "c.json");
  const CliResult r =
      run_megatune({"plan", "--model", "llama3-8b", "--cluster", dir / "c.json", "--gbs", "8"});
  expect_one_line_refusal(r, "is a directory");
}

TEST(CliDirectoryAsFile, DatabaseDirectoryIsNamedAsADirectory) {
  TempDir dir;
  expect_one_line_refusal(run_megatune({"plan", "--model", "llama3-8b", "--cluster", "1x8xH100", "--gbs", "8",
                                        "--db", dir.path()}),
                          "is a directory");
  expect_one_line_refusal(run_megatune({"db", "--db", dir.path(), "info"}), "is a directory");
}

TEST(CliDirectoryAsFile, OutputDirectoryIsRefused) {
  TempDir dir;
  const CliResult r = run_megatune(
      {"db", "--embedded", "export", "--table", "gpu_models", "--format", "csv", "-o", dir.path()});
  expect_one_line_refusal(r, "is a directory");
}

// ---- data loss: outputs replace the previous file only when complete ----

TEST(CliDataLoss, FailedPlanWriteLeavesThePreviousPlan) {
  TempDir dir;
  write_text(dir / "plan.json", "OLD PLAN");
  std::filesystem::create_directory(dir / "plan.megatune.args");  // makes one of the three writes fail
  const CliResult r = run_megatune(with(kSmallPlan, {"-o", dir / "plan.json"}), 120);
  expect_one_line_refusal(r, "plan.megatune.args");
  EXPECT_EQ(read_text(dir / "plan.json"), "OLD PLAN");
  for (const auto& entry : std::filesystem::directory_iterator(dir.path()))
    EXPECT_EQ(entry.path().filename().string().find(".tmp"), std::string::npos) << entry.path();
}

// A dry run writes nothing; a default database holding no measurement (what an interrupted profile left
// behind) does not replace the shipped profile: simulate says so and prices as without it. A database named
// with --db is used as given.
TEST(CliDataLoss, ProfileDryRunCreatesNoDatabaseAndAnEmptyDefaultIsSkipped) {
  const TempDir dir;
  const CliResult dry =
      run_megatune({"profile", "--model", "gpt-125m", "--tp", "1", "--cp", "1", "--mbs", "1", "--no-grid",
                    "--no-collectives", "--dry-run", "--db", dir / "new.db"});
  ASSERT_EQ(dry.exit_code, 0) << dry.err;
  EXPECT_NE(dry.out.find("dry run: nothing measured"), std::string::npos) << dry.out;
  EXPECT_FALSE(std::filesystem::exists(dir / "new.db"));
  {
    cost_models::Database empty = cost_models::open_cost_database(dir / "empty.db");
    cost_models::HardwareCatalog::embedded().install_into(empty);  // the catalog, as profile writes first
  }
  const std::vector<std::string> simulate = {"simulate", "--model", "tiny",  "--cluster", "1x1xH200",
                                             "--mbs",    "2",       "--gbs", "2"};
  const auto step_line = [](const std::string& out) { return line_after(out, "  ops priced "); };
  const CliResult none = run_megatune(simulate, 20, "", {"env", "MEGATUNE_DB=" + (dir / "missing.db")});
  const CliResult skipped = run_megatune(simulate, 20, "", {"env", "MEGATUNE_DB=" + (dir / "empty.db")});
  ASSERT_EQ(none.exit_code, 0) << none.err;
  ASSERT_EQ(skipped.exit_code, 0) << skipped.err;
  EXPECT_NE(skipped.out.find("empty.db holds no measurement, so embedded data"), std::string::npos)
      << skipped.out;
  EXPECT_EQ(step_line(skipped.out), step_line(none.out));
  const CliResult named = run_megatune(with(simulate, {"--db", dir / "empty.db"}));
  ASSERT_EQ(named.exit_code, 0) << named.err;
  EXPECT_EQ(named.out.find("holds no measurement"), std::string::npos) << named.out;
  EXPECT_NE(step_line(named.out), step_line(none.out)) << "an empty database prices from the catalog's peaks";
}

TEST(CliDataLoss, PlanReplacesItsOutputsWhole) {
  TempDir dir;
  write_text(dir / "plan.json", "OLD PLAN");
  const CliResult r = run_megatune(with(kSmallPlan, {"-o", dir / "plan.json"}), 120);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(read_text(dir / "plan.json").find("OLD"), std::string::npos);
  EXPECT_FALSE(read_text(dir / "plan.megatune.args").empty());
}

TEST(CliDataLoss, FullDeviceOutputsFailWithOneLine) {
  expect_one_line_refusal(run_megatune(with(kSmallPlan, {"-o", "/dev/full"}), 120), "No space left");
  expect_one_line_refusal(run_megatune({"simulate", "--model", "llama3-8b", "--cluster", "1x8xH100", "--gbs",
                                        "8", "--seq-length", "2048", "--trace", "/dev/full"},
                                       120),
                          "No space left");
  expect_one_line_refusal(run_megatune({"db", "--embedded", "export", "--table", "gpu_models", "--format",
                                        "csv", "-o", "/dev/full"}),
                          "No space left");
}

TEST(CliDataLoss, StandardOutputOnAFullDeviceIsAnError) {
  const CliResult r = run_megatune({"db", "--embedded", "export", "--table", "gpu_models"}, 20, "/dev/full");
  expect_one_line_refusal(r, "standard output");
}

// ---- silent nonsense: refused with a line naming the flag ----

TEST(CliSilentNonsense, NonFiniteZeroAndNegativeFlags) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {with(kSmallPlan, {"--memory-headroom", "nan"}), "--memory-headroom"},
      {with(kSmallPlan, {"--memory-headroom", "inf"}), "--memory-headroom"},
      {with(kSmallPlan, {"--memory-headroom", "-0.5"}), "--memory-headroom"},
      {with(kSmallPlan, {"--threads", "-5"}), "--threads"},
      {with(kSmallPlan, {"--top-k", "0"}), "--top-k"},
      {{"plan", "--model", "llama3-8b", "--cluster", "1x8xH100", "--gbs", "0"}, "--global-batch-size"},
      {{"layout", "--model", "llama3-8b", "--tp", "0"}, "--tensor-model-parallel-size"},
      {{"layout", "--model", "llama3-8b", "--mbs", "-1"}, "--micro-batch-size"},
      {{"profile", "--dry-run", "--gpus", "0"}, "--gpus"},
      {{"profile", "--dry-run", "--repeats", "0"}, "--repeats"},
      {{"db", "--embedded", "price", "gemm", "--shape", "0", "4096", "4096"}, "--shape"},
      {{"db", "--embedded", "price", "gemm", "--shape", "-8", "4096", "4096"}, "--shape"},
      {{"db", "--embedded", "price", "all_reduce", "--shape", "1024", "--group-size", "0"}, "--group-size"},
      {{"db", "--embedded", "price", "all_reduce", "--shape", "1024", "--group-nodes", "-1"},
       "--group-nodes"},
      {{"db", "--embedded", "price", "all_reduce", "--shape", "1024", "--group-size", "2", "--group-nodes",
        "4"},
       "--group-nodes"},
      {{"db", "--embedded", "price", "all_reduce", "--shape", "1024", "--group-size", "100000"},
       "--group-size"},
      {{"db", "--embedded", "price", "gemm", "--shape", "99999999999", "8", "8"}, "--shape"},
      {{"db", "--embedded", "price", "attention_fwd", "--shape", "1", "32", "7", "4096", "128"}, "--shape"},
      {{"data", "sample", "--mock-data", "--seq-length", "16", "--first", "-5"}, "--first"},
      {{"data", "sample", "--mock-data", "--seq-length", "16", "--count", "0"}, "--count"},
      {{"data", "preprocess", "--input", "x.txt", "--output-prefix", "o", "--workers", "0"}, "--workers"},
  };
  for (const auto& [args, flag] : cases) {
    SCOPED_TRACE(args.back());
    expect_one_line_refusal(run_megatune(args), flag);
  }
}

TEST(CliSilentNonsense, IgnoredFlagCombinationsAreRefused) {
  TempDir dir;
  expect_one_line_refusal(run_megatune({"db", "--db", dir / "x.db", "--embedded", "info"}), "--embedded");
  expect_one_line_refusal(
      run_megatune({"db", "--embedded", "price", "gemm", "--shape", "8", "8", "8", "--group-size", "4"}),
      "--group-size does not apply to gemm");
  expect_one_line_refusal(
      run_megatune({"db", "--embedded", "price", "all_reduce", "--shape", "8", "--no-causal"}),
      "--no-causal does not apply");
}

TEST(CliSilentNonsense, RanksOpsAndSamplesOutsideWhatExistsAreRefused) {
  expect_one_line_refusal(run_megatune({"layout", "--model", "tiny", "--rank", "-1"}),
                          "--rank: value -1 must be at least 0");
  expect_one_line_refusal(run_megatune({"layout", "--model", "tiny", "--rank", "1"}), "outside the world");
  const CliResult price = run_megatune({"db", "--embedded", "price", "gemmm", "--shape", "8", "8", "8"});
  expect_one_line_refusal(price, "gemmm");
  for (const char* known : {"gemm", "attention_bwd", "reduce_scatter", "rope_bwd", "optimizer"})
    EXPECT_NE(price.err.find(known), std::string::npos) << known << ": " << price.err;
  EXPECT_EQ(run_megatune({"db", "--embedded", "price", "rope_bwd", "--shape", "4096"}).exit_code, 0);
  TempDir dir;
  write_text(dir / "corpus.txt", "one small document\n\nand another one\n");
  ASSERT_EQ(run_megatune({"data", "preprocess", "--input", dir / "corpus.txt", "--output-prefix", dir / "c"})
                .exit_code,
            0);
  const std::vector<std::string> sample = {"data",    "sample", "--data-path",  dir / "c_text_document",
                                           "--split", "1,0,0",  "--seq-length", "4"};
  const CliResult last = run_megatune(with(sample, {"--first", "0", "--count", "1000"}));
  ASSERT_EQ(last.exit_code, 0) << last.err;
  const std::string samples = std::to_string(std::count(last.out.begin(), last.out.end(), '\n') - 1);
  const CliResult past = run_megatune(with(sample, {"--first", samples}));
  expect_one_line_refusal(
      past, "--first " + samples + " is past the end of the train split, which has " + samples + " samples");
  EXPECT_EQ(run_megatune(with(sample, {"--first", std::to_string(std::stoi(samples) - 1)})).exit_code, 0);
}

TEST(CliSilentNonsense, ABinaryOrForeignFileIsNotImportedAsZeroRows) {
  TempDir dir;
  const std::string db = dir / "x.db";
  write_text(dir / "binary.csv", std::string("\x89PNG\r\n\x1a\n\0\0\0\rIHDR", 16));
  expect_one_line_refusal(
      run_megatune({"db", "--db", db, "import", dir / "binary.csv", "--table", "gpu_models"}),
      "holds binary data");
  write_text(dir / "foreign.csv", "when,what\n");  // a header of another table and no rows
  expect_one_line_refusal(
      run_megatune({"db", "--db", db, "import", dir / "foreign.csv", "--table", "gpu_models"}),
      "column \"when\" is not in table gpu_models");
}

TEST(CliSilentNonsense, AbsurdClusterFileValues) {
  TempDir dir;
  const std::vector<std::pair<std::string, std::string>> files = {
      {R"({"gpu": "H100", "gpu_overrides": {"memory_bytes": 1e300}})", "memory_bytes"},
      {R"({"gpu": "H100", "gpu_overrides": {"peak_bf16_tflops": -3}})", "peak_bf16_tflops"},
      {R"({"gpu": "H100", "inter_node_overrides": {"bandwidth_per_direction_bytes_per_s": 1e-300}})",
       "bandwidth_per_direction_bytes_per_s"},
      {R"({"gpu": "H100", "intra_node_overrides": {"domain_size": 8.5}})", "domain_size"},
      {R"({"gpu": "H100", "intra_node_overrides": {"latency_s": 1e9}})", "latency_s"},
      {R"({"gpu": "H100", "memory_bytes": 1e300})", "unknown key \"memory_bytes\""},
      {R"({"gpu": "H100", "gpu_overrides": {"memory": 8e10}})", "unknown key \"memory\""},
      {R"({"gpu": "H100", "nodes": 2.5})", "nodes"},
      {R"({"gpu": "H100", "nodes": 1e12})", "nodes"},
  };
  for (const auto& [json, key] : files) {
    SCOPED_TRACE(json);
    write_text(dir / "cluster.json", json);
    expect_one_line_refusal(
        run_megatune({"simulate", "--model", "llama3-8b", "--cluster", dir / "cluster.json", "--gbs", "8"}),
        key);
  }
  expect_one_line_refusal(
      run_megatune({"plan", "--model", "llama3-8b", "--cluster", "300000x4xH100", "--gbs", "8"}), "GPUs");
}

// The seconds printed on simulate's "exposed comm" line.
double exposed_comm_s(const CliResult& r) {
  const std::size_t at = r.out.find("exposed comm");
  EXPECT_NE(at, std::string::npos) << r.out;
  return at == std::string::npos ? 0.0 : std::stod(r.out.substr(at + std::string("exposed comm").size()));
}

TEST(CliSimulate, CommunicationFlagsChangeTheExposedTime) {
  const std::vector<std::string> base{"simulate", "--model", "llama3-8b", "--cluster", "1x8xH100",
                                      "--gbs",    "8",       "--tp",      "2",         "--sequence-parallel"};
  const CliResult blocking = run_megatune(base);
  const CliResult overlapped = run_megatune(with(base, {"--tp-comm-overlap"}));
  const CliResult bf16_grads = run_megatune(with(base, {"--grad-reduce-in-bf16"}));
  ASSERT_EQ(blocking.exit_code, 0) << blocking.err;
  ASSERT_EQ(overlapped.exit_code, 0) << overlapped.err;
  ASSERT_EQ(bf16_grads.exit_code, 0) << bf16_grads.err;
  EXPECT_LT(exposed_comm_s(overlapped), exposed_comm_s(blocking));
  EXPECT_LT(exposed_comm_s(bf16_grads), exposed_comm_s(blocking));
  EXPECT_NE(bf16_grads.out.find("bf16 grad buffers, 2 B per gradient"), std::string::npos) << bf16_grads.out;
  expect_one_line_refusal(run_megatune({"simulate", "--model", "llama3-8b", "--cluster", "1x8xH100", "--gbs",
                                        "8", "--tp", "2", "--tp-comm-overlap"}),
                          "add --sequence-parallel");
  expect_one_line_refusal(
      run_megatune(with(base, {"--grad-reduce-in-bf16", "--accumulate-allreduce-grads-in-fp32"})),
      "--grad-reduce-in-bf16 excludes --accumulate-allreduce-grads-in-fp32");
}

TEST(CliSilentNonsense, UnknownChoicesAreRefusedWhileParsing) {
  expect_one_line_refusal(run_megatune(with(kSmallPlan, {"--recompute-granularity", "partial"})),
                          "--recompute-granularity: partial not in {none,selective,full}");
  expect_one_line_refusal(run_megatune({"layout", "--model", "llama3-8b", "--normalization", "BatchNorm"}),
                          "--normalization: BatchNorm not in {LayerNorm,RMSNorm}");
  expect_one_line_refusal(run_megatune({"simulate", "--model", "tiny", "--cluster", "1x1xH100", "--gbs", "8",
                                        "--granularity", "op"}),
                          "--granularity: op not in {pass,kernel}");
  expect_one_line_refusal(run_megatune({"train", "--model", "tiny", "--mock-data", "--device", "gpu"}),
                          "--device: gpu not in {cuda,cpu}");
  expect_one_line_refusal(
      run_megatune({"db", "--embedded", "export", "--table", "gpu_models", "--format", "xml"}),
      "--format: xml not in {csv,json}");
  // Valid names still reach the model: no learned position table, norms without a bias.
  const CliResult rope = run_megatune({"layout", "--model", "gpt-125m", "--position-embedding-type", "rope",
                                       "--normalization", "RMSNorm", "--gbs", "8"});
  EXPECT_EQ(rope.exit_code, 0) << rope.err;
  EXPECT_NE(rope.out.find("123.67M params"), std::string::npos) << rope.out;
  EXPECT_NE(run_megatune({"layout", "--model", "gpt-125m", "--gbs", "8"}).out.find("125.26M params"),
            std::string::npos);
}

// ---- unclear messages ----

TEST(CliUnclear, RangeMessagesStateTheRealBound) {
  const CliResult r = run_megatune({"profile", "--dry-run", "--gpus", "0"});
  expect_one_line_refusal(r, "at least 1");
  EXPECT_EQ(r.err.find("1797"), std::string::npos) << r.err;
}

TEST(CliUnclear, TensorParallelSizeAdviceNamesDivisors) {
  const CliResult r = run_megatune(with(kSmallPlan, {"--tp", "3"}));
  expect_one_line_refusal(r, "--tp 1, 2, 4 or 8");
  EXPECT_EQ(r.err.find("more GPUs"), std::string::npos) << r.err;
  TempDir dir;
  write_text(dir / "c.json", R"({"gpu": "H100", "nodes": 1, "gpus_per_node": 6})");
  const CliResult heads =
      run_megatune({"plan", "--model", "llama3-8b", "--cluster", dir / "c.json", "--gbs", "12", "--tp", "3"});
  expect_one_line_refusal(heads, "32 attention heads");
}

TEST(CliUnclear, ErrorsNameTheFlagsTheUserGave) {
  const CliResult simulate =
      run_megatune({"simulate", "--model", "llama3-8b", "--cluster", "1x8xH100", "--gbs", "8", "--tp", "3"});
  expect_one_line_refusal(simulate, "--cluster 1x8xH100");
  EXPECT_EQ(simulate.err.find("--world-size"), std::string::npos) << simulate.err;
  expect_one_line_refusal(run_megatune(with(kSmallPlan, {"--mbs", "3"})), "use --mbs 1, 2, 4, 8");
}

TEST(CliUnclear, NestedLayoutGroupIsNamed) {
  const CliResult r = run_megatune({"layout", "--model", "llama3-8b", "--pp", "2", "--world-size", "2",
                                    "--pipeline-model-parallel-layout", "E(t(tt)|)*2L"});
  expect_one_line_refusal(r, "nested");
}

TEST(CliUnclear, OverflowIsReportedAgainstTheFlagsGiven) {
  const CliResult r = run_megatune({"layout", "--model", "llama3-8b", "--tp", "65536", "--pp", "65536"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.err.find("--world-size -"), std::string::npos) << r.err;
  EXPECT_FALSE(has_source_location(r.err)) << r.err;
}

TEST(CliUnclear, PreprocessRefusesAKeyGivenTwiceAndWritesNothing) {
  TempDir dir;
  write_text(dir / "in.jsonl", "{\"text\": \"hello\"}\n");
  const CliResult r = run_megatune({"data", "preprocess", "--input", dir / "in.jsonl", "--output-prefix",
                                    dir / "out", "--json-keys", "text", "text"});
  expect_one_line_refusal(r, "--json-keys names 'text' twice");
  EXPECT_FALSE(std::filesystem::exists(dir / "out_text_document.bin"));
  EXPECT_FALSE(std::filesystem::exists(dir / "out_text_document.idx"));
}

TEST(CliUnclear, AJsonErrorStatesItsPositionOnce) {
  TempDir dir;
  std::filesystem::create_directory(dir / "run");
  write_text(dir / "run/run.json", "{\"format\":\n x}");
  const CliResult trace = run_megatune({"compare", "--run", dir / "run"});
  expect_one_line_refusal(trace, "run.json: line 2, column 2: syntax error");
  write_text(dir / "rows.json", "[{\"name\": 1,\n ]");
  const CliResult rows =
      run_megatune({"db", "--db", dir / "x.db", "import", dir / "rows.json", "--table", "gpu_models"});
  expect_one_line_refusal(rows, "rows.json:2: invalid JSON at column 2 (syntax error");
  for (const CliResult* r : {&trace, &rows}) {
    const std::string& err = r->err;
    EXPECT_EQ(err.find("column"), err.rfind("column")) << err;
    EXPECT_EQ(err.find("line 2"), err.rfind("line 2")) << err;
  }
}

TEST(CliUnclear, ReadOnlyDatabaseIsReadable) {
  TempDir dir;
  const std::string db = dir / "shared.db";
  ASSERT_EQ(run_megatune({"db", "--db", db, "info"}).exit_code, 0);
  std::vector<std::string> as_other_user;
  if (::geteuid() == 0) {
    if (std::system("command -v setpriv > /dev/null 2>&1") != 0) GTEST_SKIP() << "root without setpriv";
    as_other_user = {"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"};
  }
  const std::string empty_csv = dir / "empty.csv";  // written before the folder turns read-only
  write_text(empty_csv, "");
  ::chmod(db.c_str(), 0444);
  ::chmod(dir.path().c_str(), 0555);
  const CliResult info = run_megatune({"db", "--db", db, "info"}, 20, "", as_other_user);
  EXPECT_EQ(info.exit_code, 0) << info.err;
  EXPECT_NE(info.out.find("gpu_models"), std::string::npos) << info.out;
  const CliResult import =
      run_megatune({"db", "--db", db, "import", empty_csv, "--table", "gpu_models"}, 20, "", as_other_user);
  expect_one_line_refusal(import, "read-only");
  ::chmod(dir.path().c_str(), 0755);
}

}  // namespace
}  // namespace megatune::tests
