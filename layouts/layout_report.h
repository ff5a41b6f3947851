// LayoutReport: what `megatune layout` prints for a validated (model, parallel config): per rank its grid
// coordinates, groups, stages and layers held, and schedule; as aligned text or JSON.
#pragma once
#include <string>
#include <vector>

#include "base/json_quote.h"
#include "layouts/model_spec.h"
#include "layouts/parallel_config.h"

namespace megatune::layouts {

struct LayoutReportOptions {
  int only_rank = -1;  // -1: every rank
  bool include_schedule = true;
  bool include_p2p = true;  // p2p groups in the schedule text
};

// Validates (UserError on bad input) and renders.
std::string layout_report_text(const ModelSpec& model, const ParallelConfig& config,
                               const LayoutReportOptions& options = {});
std::string layout_report_json(const ModelSpec& model, const ParallelConfig& config,
                               const LayoutReportOptions& options = {});

// One line per stage in global order: "stage 0  pp 0 vpp 0  Ettt  layers 0-2", used by both renderers.
std::vector<std::string> stage_assignment_lines(const PipelineLayout& layout);

// Layers held by a stage as text: "E t0-2", "t59-60 m0", "L", "(empty)".
std::string stage_contents(const PipelineStage& stage);

}  // namespace megatune::layouts
