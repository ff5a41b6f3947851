// Megatron-LM's FP8 flags: parsed into layouts::Fp8Settings, and written back for emitted commands.
#include "tools/fp8_flags.h"

#include "tools/input_checks.h"

namespace megatune::tools {

void add_fp8_flags(CLI::App& app, layouts::Fp8Settings& settings) {
  app.add_option_function<std::string>(
         "--fp8-format",
         [&settings](const std::string& v) {
           settings.format = v == "hybrid" ? layouts::Fp8Format::kHybrid : layouts::Fp8Format::kE4M3;
         },
         "FP8 GEMMs in the linear layers: e4m3 (every tensor) or hybrid (E5M2 gradients)")
      ->check(CLI::IsMember({"e4m3", "hybrid"}));
  app.add_option_function<std::string>(
         "--fp8-recipe",
         [&settings](const std::string& v) {
           if (v == "mxfp8" || v == "blockwise")
             throw CLI::ValidationError("--fp8-recipe",
                                        v + " scaling is not run by megatune: use delayed (Megatron's "
                                            "default) or tensorwise");
           settings.recipe =
               v == "tensorwise" ? layouts::Fp8Recipe::kTensorwise : layouts::Fp8Recipe::kDelayed;
         },
         "FP8 scaling: delayed (amax history, Megatron's default) or tensorwise (each tensor's own amax)")
      ->check(CLI::IsMember({"delayed", "tensorwise", "mxfp8", "blockwise"}));
  app.add_option("--fp8-margin", settings.margin, "FP8 scaling margin: scale = fp8 max / amax / 2^margin (0)")
      ->check(CLI::Range(0, 30));
  app.add_option("--fp8-amax-history-len", settings.amax_history_len,
                 "delayed scaling: amax history length (Megatron's default 1)")
      ->check(integer_at_least(1));
  app.add_option_function<std::string>(
         "--fp8-amax-compute-algo", [&settings](const std::string& v) { settings.amax_max = v == "max"; },
         "delayed scaling: the amax from the history's maximum (max) or newest entry (most_recent, default)")
      ->check(CLI::IsMember({"max", "most_recent"}));
}

std::vector<std::string> fp8_flag_arguments(const layouts::Fp8Settings& s) {
  if (!s.enabled()) return {};
  std::vector<std::string> args = {"--fp8-format", layouts::fp8_format_name(s.format), "--fp8-recipe",
                                   layouts::fp8_recipe_name(s.recipe)};
  if (s.margin != 0) args.insert(args.end(), {"--fp8-margin", std::to_string(s.margin)});
  if (s.recipe == layouts::Fp8Recipe::kDelayed) {
    args.insert(args.end(), {"--fp8-amax-history-len", std::to_string(s.amax_history_len),
                             "--fp8-amax-compute-algo", s.amax_max ? "max" : "most_recent"});
  }
  return args;
}

}  // namespace megatune::tools
