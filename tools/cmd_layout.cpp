// `megatune layout`: validate a model + parallel layout + world size and print, per rank, its grid
// coordinates, groups, stages/layers and pipeline schedule (text or --json).
#include <cstdio>

#include "layouts/layout_report.h"
#include "tools/command_registry.h"
#include "tools/input_checks.h"
#include "tools/megatron_args.h"

namespace megatune::tools {
namespace {

struct LayoutCommandOptions {
  MegatronArgs args;
  bool json = false;
  int rank = -1;
  bool no_schedule = false;
  bool no_p2p = false;
};

const Registrar kLayoutCommand{
    Command{"layout",
            "Validate a Megatron layout and print each rank's grid coordinates, groups, layers and schedule",
            20, [](CLI::App& sub) -> std::function<int()> {
              auto options = std::make_shared<LayoutCommandOptions>();
              add_model_flags(sub, options->args);
              add_parallel_flags(sub, options->args);
              add_batch_flags(sub, options->args);
              sub.add_flag("--json", options->json, "Print JSON instead of text")->group("Output");
              sub.add_option("--rank", options->rank, "Print only this global rank")
                  ->check(integer_at_least(0))
                  ->group("Output");
              sub.add_flag("--no-schedule", options->no_schedule, "Leave the schedules out")->group("Output");
              sub.add_flag("--no-p2p", options->no_p2p, "Schedules without the p2p groups")->group("Output");
              sub.footer(
                  "Example (DeepSeek-V3, PP16 x VPP2):\n  megatune layout --model deepseek-v3 --world-size "
                  "16 --pp 16 "
                  "--gbs 32 --pipeline-model-parallel-layout 'Et*3|(tt|)*29,m|L'\n"
                  "Schedule text: F<mb>.<chunk> / B<mb>.<chunk>; [..] is one batched p2p group: +a/-a "
                  "send/recv activation, "
                  "+g/-g send/recv gradient, @<peer pp rank>.");
              return [options]() {
                const layouts::ModelSpec model = resolve_model(options->args);
                const layouts::ParallelConfig config = resolve_parallel(options->args);
                layouts::LayoutReportOptions report;
                report.only_rank = options->rank;
                report.include_schedule = !options->no_schedule;
                report.include_p2p = !options->no_p2p;
                const std::string text = options->json ? layouts::layout_report_json(model, config, report)
                                                       : layouts::layout_report_text(model, config, report);
                std::fwrite(text.data(), 1, text.size(), stdout);
                return 0;
              };
            }}};

}  // namespace
}  // namespace megatune::tools
