// resolve_target and read_traced_run: Megatron flags into a (model, layout), and a traced run joined to it.
#include "tools/traced_run_target.h"

#include <algorithm>
#include <sstream>

#include "layouts/user_error.h"
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
  std::reverse(args.begin(), args.end());  // CLI11 takes a vector in reverse order
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    throw UserError(source + ": " + e.what() + "; give Megatron flags such as --model tiny --tp 2");
  }
  ResolvedTarget r{resolve_model(megatron), resolve_parallel(megatron)};
  r.config.validate(r.model);
  return r;
}

TracedRunTarget read_traced_run(const std::string& dir) {
  TracedRunTarget t{planner::read_measured_run(dir), {}};
  t.target = resolve_target(t.run.model_args, "the run's flags (" + dir + "/run.json)");
  planner::check_join(t.run, t.target.model, t.target.config);
  return t;
}

}  // namespace megatune::tools
