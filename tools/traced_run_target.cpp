// resolve_target and read_traced_run: Megatron flags into a (model, layout), and a traced run joined to it.
#include "tools/traced_run_target.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>

#include "base/user_error.h"
#include "executor/training/run_setup.h"
#include "layouts/flops.h"
#include "layouts/rank_grid.h"
#include "tools/fp8_flags.h"
#include "tools/megatron_args.h"

namespace megatune::tools {

std::vector<std::string> split_words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

ResolvedTarget resolve_target(std::vector<std::string> args, const std::string& source) {
  CLI::App app{"compare target"};
  app.allow_extras();
  MegatronArgs megatron;
  add_model_flags(app, megatron);
  add_parallel_flags(app, megatron);
  add_batch_flags(app, megatron);
  layouts::Fp8Settings fp8;
  add_fp8_flags(app, fp8);
  std::reverse(args.begin(), args.end());  // CLI11 takes a vector in reverse order
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    throw UserError(source + ": " + e.what() + "; give Megatron flags such as --model tiny --tp 2");
  }
  try {
    ResolvedTarget r{resolve_model(megatron), resolve_parallel(megatron), {}};
    r.config.validate(r.model);
    r.step.fp8 = fp8;
    return r;
  } catch (const UserError& e) {
    throw UserError(source + ": " + e.what());
  }
}

TracedRunTarget read_traced_run(const std::string& dir) {
  TracedRunTarget t{calibration::read_measured_run(dir), {}};
  t.target = resolve_target(t.run.model_args, "the run's flags (" + dir + "/run.json)");
  check_recorded_run(t.run, t.target);
  return t;
}

namespace {

// One line for a run.json field that its own model_args contradict.
[[noreturn]] void contradicted(const calibration::MeasuredRun& run, const std::string& field,
                               const std::string& recorded, const std::string& built) {
  throw UserError("--run " + run.dir + ": run.json records " + field + " " + recorded +
                  ", its model_args build " + built +
                  " (an edited or foreign run.json); re-run megatune train --trace-dir");
}

void check_rank_coordinates(const calibration::MeasuredRun& run, const layouts::ParallelConfig& config) {
  const layouts::RankGrid grid = layouts::RankGrid::from_config(config);
  for (const calibration::TracedRank& rank : run.ranks) {
    const layouts::DenseCoordinates c = grid.dense_coordinates(rank.rank);
    if (rank.tp != c.tp || rank.pp != c.pp || rank.dp != c.dp || rank.cp != c.cp) {
      const auto text = [](int tp, int pp, int dp, int cp) {
        return "tp" + std::to_string(tp) + " pp" + std::to_string(pp) + " dp" + std::to_string(dp) + " cp" +
               std::to_string(cp);
      };
      contradicted(run, "rank " + std::to_string(rank.rank) + " at", text(rank.tp, rank.pp, rank.dp, rank.cp),
                   text(c.tp, c.pp, c.dp, c.cp));
    }
  }
}

}  // namespace

void check_recorded_run(const calibration::MeasuredRun& run, const ResolvedTarget& own) {
  const layouts::ModelSpec& model = own.model;
  const layouts::ParallelConfig& config = own.config;
  if (run.model != model.name) contradicted(run, "model", "'" + run.model + "'", "'" + model.name + "'");
  const std::string layout = executor::describe_layout(model, config);
  if (run.layout != layout) contradicted(run, "layout", "'" + run.layout + "'", "'" + layout + "'");
  if (run.world_size != config.world_size)
    contradicted(run, "world_size", std::to_string(run.world_size), std::to_string(config.world_size));
  if (run.micro_batch_size != config.micro_batch_size)
    contradicted(run, "micro_batch_size", std::to_string(run.micro_batch_size),
                 std::to_string(config.micro_batch_size));
  const std::int64_t gbs = config.resolved_global_batch_size();
  if (run.global_batch_size != gbs)
    contradicted(run, "global_batch_size", std::to_string(run.global_batch_size), std::to_string(gbs));
  const double flops = layouts::model_flops_per_iteration(model, gbs, 1);
  if (!(std::fabs(run.model_flops_per_iteration - flops) <= 1e-6 * flops))
    contradicted(run, "model_flops_per_iteration", std::to_string(run.model_flops_per_iteration),
                 std::to_string(flops));
  check_rank_coordinates(run, config);
  calibration::check_join(run, model, config, calibration::JoinTarget::kRunFlags, own.step);
}

void require_distinct_runs(const std::vector<std::string>& dirs) {
  std::map<std::string, std::string> seen;  // canonical folder -> as given
  for (const std::string& dir : dirs) {
    std::error_code ec;
    std::filesystem::path canonical = std::filesystem::weakly_canonical(dir, ec);
    if (!canonical.has_filename()) canonical = canonical.parent_path();  // "run/" is "run"
    const std::string key = ec ? dir : canonical.string();
    const auto [at, fresh] = seen.emplace(key, dir);
    if (!fresh)
      throw UserError("--run " + dir + " is given twice" +
                      (at->second == dir ? "" : " (also as " + at->second + ")") +
                      ": each traced run counts once; drop the repeat");
  }
}

}  // namespace megatune::tools
