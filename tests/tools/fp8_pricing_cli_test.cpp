// FP8 in the commands that price: `simulate` and `plan` take train's FP8 flags and price the FP8 step program
// (its op count, transferred GEMM prices, the FP8 memory), `plan`'s emitted commands carry the flags and
// `train --dry-run` of them describes the same run, `compare` of an FP8 traced run joins the FP8 program;
// bad FP8 input gets one line.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "cost_models/cost_database.h"
#include "layouts/fp8.h"
#include "layouts/model_spec.h"
#include "layouts/parallel_config.h"
#include "layouts/step_program.h"
#include "plan_dry_run.h"

namespace megatune::tests {
namespace {

const std::vector<std::string> kSimulateTiny = {"simulate", "--model",       "tiny",  "--cluster",
                                                "1x1xH200", "--mbs",         "2",     "--gbs",
                                                "2",        "--granularity", "kernel"};

std::vector<std::string> with(std::vector<std::string> args, const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// The "ops priced" line's counts: measured, interpolated, fitted, transferred, analytic.
std::vector<long long> priced_counts(const std::string& out) {
  const std::string line = line_after(out, "  ops priced       ");
  long long c[5] = {-1, -1, -1, -1, -1};
  std::sscanf(line.c_str(), "measured %lld, interpolated %lld, fitted %lld, transferred %lld, analytic %lld",
              &c[0], &c[1], &c[2], &c[3], &c[4]);
  return {c[0], c[1], c[2], c[3], c[4]};
}

long long sum(const std::vector<long long>& v) {
  long long s = 0;
  for (long long x : v) s += x;
  return s;
}

std::size_t program_ops(const layouts::Fp8Settings& fp8) {
  const layouts::ModelSpec model = layouts::model_preset("tiny");
  layouts::ParallelConfig config;
  config.micro_batch_size = 2;
  config.global_batch_size = 2;
  config.validate(model);
  layouts::StepProgramOptions options;
  options.fp8 = fp8;
  return layouts::build_step_program(model, config, 0, options).ops.size();
}

TEST(Fp8Simulate, PricesEveryOpOfTheFp8StepProgram) {
  const CliResult bf16 = run_megatune(kSimulateTiny);
  ASSERT_EQ(bf16.exit_code, 0) << bf16.err;
  layouts::Fp8Settings fp8;
  fp8.format = layouts::Fp8Format::kHybrid;
  const CliResult hybrid = run_megatune(with(kSimulateTiny, {"--fp8-format", "hybrid"}));
  ASSERT_EQ(hybrid.exit_code, 0) << hybrid.err;
  EXPECT_EQ(sum(priced_counts(bf16.out)), static_cast<long long>(program_ops({})));
  EXPECT_EQ(sum(priced_counts(hybrid.out)), static_cast<long long>(program_ops(fp8)));
  EXPECT_GT(program_ops(fp8), program_ops({}));
  // The shipped H200 profile holds measured FP8 GEMMs and casts: the FP8 ops are priced from them (fitted
  // for the tiny model's shapes), none transferred, and the line says where the prices come from.
  EXPECT_EQ(priced_counts(hybrid.out)[3], 0) << hybrid.out;
  EXPECT_NE(hybrid.out.find("precision: fp8 hybrid delayed"), std::string::npos) << hybrid.out;
  EXPECT_NE(hybrid.out.find(" fp8 measurements and a fit of H200 SXM"), std::string::npos) << hybrid.out;
  EXPECT_NE(hybrid.out.find("from measured FP8 casts"), std::string::npos) << hybrid.out;
  EXPECT_EQ(bf16.out.find("precision:"), std::string::npos) << bf16.out;
  // An unprofiled GPU (H100) prices the H200's FP8 measurements scaled to itself, and the line says so.
  std::vector<std::string> h100 = kSimulateTiny;
  *std::find(h100.begin(), h100.end(), "1x1xH200") = "1x1xH100";
  const CliResult scaled = run_megatune(with(h100, {"--fp8-format", "hybrid"}));
  ASSERT_EQ(scaled.exit_code, 0) << scaled.err;
  EXPECT_EQ(sum(priced_counts(scaled.out)), static_cast<long long>(program_ops(fp8)));
  EXPECT_NE(scaled.out.find("fp8 measurements and a fit of H200 SXM"), std::string::npos) << scaled.out;
  EXPECT_NE(scaled.out.find("scaled to H100 SXM"), std::string::npos) << scaled.out;
  // A database without fp8 measurements: FP8 GEMMs transferred from the bf16 prices, and the line says so.
  const TempDir dir;
  ASSERT_EQ(run_megatune({"db", "--db", dir / "bf16.db", "info"}).exit_code, 0);  // the shipped data
  {
    cost_models::Database bf16_only = cost_models::open_cost_database(dir / "bf16.db");
    bf16_only.execute(
        "DELETE FROM kernel_timings WHERE dtype = 'fp8'; DELETE FROM fitted_models WHERE variant = 'fp8' OR "
        "variant LIKE '%:fp8'");
  }
  const CliResult transferred =
      run_megatune(with(kSimulateTiny, {"--fp8-format", "hybrid", "--db", dir / "bf16.db"}));
  ASSERT_EQ(transferred.exit_code, 0) << transferred.err;
  EXPECT_EQ(sum(priced_counts(transferred.out)), static_cast<long long>(program_ops(fp8)));
  EXPECT_GT(priced_counts(transferred.out)[3], 0) << transferred.out;
  EXPECT_NE(transferred.out.find("FP8 GEMMs transferred from the bf16 prices"), std::string::npos)
      << transferred.out;
  EXPECT_NE(transferred.out.find("low confidence"), std::string::npos) << transferred.out;
  EXPECT_NE(transferred.out.find("from the element-wise kernels' model"), std::string::npos)
      << transferred.out;

  fp8.recipe = layouts::Fp8Recipe::kTensorwise;
  fp8.format = layouts::Fp8Format::kE4M3;
  const CliResult tensorwise =
      run_megatune(with(kSimulateTiny, {"--fp8-format", "e4m3", "--fp8-recipe", "tensorwise"}));
  ASSERT_EQ(tensorwise.exit_code, 0) << tensorwise.err;
  EXPECT_EQ(sum(priced_counts(tensorwise.out)), static_cast<long long>(program_ops(fp8)));
  EXPECT_NE(tensorwise.out.find("precision: fp8 e4m3 tensorwise"), std::string::npos) << tensorwise.out;
}

TEST(Fp8Simulate, CountsTheFp8WeightCopiesInMemory) {
  const std::vector<std::string> gpt = {"simulate", "--model", "gpt-125m", "--cluster", "1x1xH200",
                                        "--mbs",    "2",       "--gbs",    "2"};
  const CliResult bf16 = run_megatune(gpt);
  const CliResult fp8 = run_megatune(with(gpt, {"--fp8-format", "hybrid"}));
  ASSERT_EQ(bf16.exit_code, 0) << bf16.err;
  ASSERT_EQ(fp8.exit_code, 0) << fp8.err;
  EXPECT_EQ(bf16.out.find("FP8 weight copies"), std::string::npos);
  EXPECT_NE(fp8.out.find("FP8 weight copies"), std::string::npos) << fp8.out;
  EXPECT_NE(fp8.out.find("FP8 casts of linear inputs"), std::string::npos) << fp8.out;
  double bf16_gib = 0, fp8_gib = 0;
  std::sscanf(line_after(bf16.out, "  total").c_str(), "%lf", &bf16_gib);
  std::sscanf(line_after(fp8.out, "  total").c_str(), "%lf", &fp8_gib);
  EXPECT_GT(fp8_gib, bf16_gib) << bf16.out << fp8.out;
}

TEST(Fp8Simulate, BadFp8InputIsOneLine) {
  const CliResult recipe =
      run_megatune(with(kSimulateTiny, {"--fp8-format", "e4m3", "--fp8-recipe", "mxfp8"}));
  EXPECT_NE(recipe.exit_code, 0);
  EXPECT_EQ(recipe.error_lines(), 1) << recipe.err;
  EXPECT_NE(recipe.err.find("use delayed"), std::string::npos) << recipe.err;
  const CliResult format = run_megatune(with(kSimulateTiny, {"--fp8-format", "e5m2"}));
  EXPECT_NE(format.exit_code, 0);
  EXPECT_EQ(format.error_lines(), 1) << format.err;
  EXPECT_NE(format.err.find("--fp8-format"), std::string::npos) << format.err;
  // 1 x 24 tokens per micro-batch: train would refuse the FP8 GEMMs, so simulate does too.
  const CliResult shape =
      run_megatune({"simulate", "--model", "tiny", "--cluster", "1x1xH200", "--seq-length", "24", "--mbs",
                    "1", "--gbs", "1", "--fp8-format", "e4m3"});
  EXPECT_EQ(shape.exit_code, 1);
  EXPECT_EQ(shape.error_lines(), 1) << shape.err;
  EXPECT_NE(shape.err.find("multiples of 16"), std::string::npos) << shape.err;
}

TEST(Fp8Plan, EmittedCommandsCarryTheFlagsAndDescribeTheSameRun) {
  const PlanAndDryRun run = plan_then_dry_run(
      {"--model", "gpt-125m", "--gbs", "16", "--fp8-format", "hybrid", "--fp8-amax-history-len", "16"});
  ASSERT_EQ(run.planned.exit_code, 0) << run.planned.err;
  const std::string precision = line_after(run.planned.out, "precision: ");
  EXPECT_EQ(precision, "fp8 hybrid delayed (amax history 16, most_recent, margin 0)") << run.planned.out;
  for (const std::string* args : {&run.megatune_args, &run.megatron_args}) {
    EXPECT_NE(args->find("--fp8-format hybrid --fp8-recipe delayed"), std::string::npos) << *args;
    EXPECT_NE(args->find("--fp8-amax-history-len 16"), std::string::npos) << *args;
    EXPECT_NE(args->find("--bf16"), std::string::npos) << *args;
  }
  ASSERT_EQ(run.dry.exit_code, 0) << run.megatune_args << run.dry.err;
  EXPECT_EQ(line_after(run.dry.out, "precision: "), precision);
  EXPECT_EQ(line_after(run.dry.out, "settings: "), line_after(run.planned.out, "settings: "));
  EXPECT_EQ(line_after(run.dry.out, "model: "), line_after(run.planned.out, "model: "));
  // Every candidate is priced as FP8 (the plan's H100 cluster from the H200's fp8 measurements, scaled).
  EXPECT_NE(run.planned.out.find("FP8 GEMMs from "), std::string::npos) << run.planned.out;
  EXPECT_NE(run.planned.out.find("scaled to H100"), std::string::npos) << run.planned.out;
}

TEST(Fp8Plan, Fp8IsTheUsersChoiceNotSearched) {
  const std::vector<std::string> plan = {"plan",  "--model", "gpt-125m",  "--cluster", "1x8xH100",
                                         "--gbs", "16",      "--threads", "2"};
  const CliResult bf16 = run_megatune(plan, 120);
  const CliResult fp8 = run_megatune(with(plan, {"--fp8-format", "e4m3", "--fp8-recipe", "tensorwise"}), 120);
  ASSERT_EQ(bf16.exit_code, 0) << bf16.err;
  ASSERT_EQ(fp8.exit_code, 0) << fp8.err;
  EXPECT_EQ(bf16.out.find("--fp8-format"), std::string::npos) << bf16.out;
  EXPECT_NE(fp8.out.find("--fp8-format e4m3 --fp8-recipe tensorwise"), std::string::npos) << fp8.out;
  const CliResult refused = run_megatune(with(plan, {"--fp8-recipe", "blockwise", "--fp8-format", "e4m3"}));
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_EQ(refused.error_lines(), 1) << refused.err;
}

TEST(Fp8Profile, DryRunListsTheFp8GemmsAndCastsAndNeedsAModel) {
  const TempDir dir;  // the dry run opens its database: a temporary one, never the default
  const CliResult dry =
      run_megatune({"profile", "--model", "llama3-1b", "--fp8-format", "hybrid", "--tp", "1", "--cp", "1",
                    "--mbs", "2", "--no-grid", "--no-collectives", "--dry-run", "--db", dir / "costs.db"});
  ASSERT_EQ(dry.exit_code, 0) << dry.err;
  unsigned gemms = 0, casts = 0;
  std::sscanf(line_after(dry.out, "fp8 hybrid delayed (amax history 1, most_recent, margin 0): ").c_str(),
              "%u FP8 GEMMs and %u FP8 casts", &gemms, &casts);
  EXPECT_GT(gemms, 0u) << dry.out;
  EXPECT_GT(casts, 0u) << dry.out;
  const CliResult no_model = run_megatune({"profile", "--fp8-format", "hybrid", "--dry-run"});
  EXPECT_NE(no_model.exit_code, 0);
  EXPECT_EQ(no_model.error_lines(), 1) << no_model.err;
  EXPECT_NE(no_model.err.find("--model PRESET"), std::string::npos) << no_model.err;
}

TEST(Fp8Compare, AnFp8TracedRunJoinsTheFp8StepProgram) {
  const TempDir dir;
  const std::string run_dir = dir / "fp8run";
  const CliResult train =
      run_megatune({"train", "--model", "tiny", "--device", "cpu", "--bf16", "--mock-data", "--train-iters",
                    "4", "--gbs", "4", "--mbs", "2", "--fp8-format", "hybrid", "--trace-dir", run_dir},
                   120);
  ASSERT_EQ(train.exit_code, 0) << train.err;
  const CliResult compare = run_megatune({"compare", "--run", run_dir}, 120);
  ASSERT_EQ(compare.exit_code, 0) << compare.err;
  EXPECT_NE(compare.out.find("step time"), std::string::npos) << compare.out;
  EXPECT_NE(compare.out.find("fp8 hybrid delayed (amax history 1, most_recent, margin 0): FP8 GEMMs"),
            std::string::npos)
      << compare.out;
  // Simulated without the run's FP8 flags, the trace does not join: the message names the first op.
  const CliResult bf16 =
      run_megatune({"compare", "--run", run_dir, "--simulate-args", "--model tiny --gbs 4 --mbs 2"}, 120);
  EXPECT_NE(bf16.exit_code, 0);
  EXPECT_EQ(bf16.error_lines(), 1) << bf16.err;
  EXPECT_NE(bf16.err.find("differs in"), std::string::npos) << bf16.err;
}

}  // namespace
}  // namespace megatune::tests
