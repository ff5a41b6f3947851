// plan --against "...flags...": the layout the user would have tried, from Megatron flags parsed as plan
// parses its own, on the plan's model, cluster and global batch, priced and sized like the plan's candidates.
#pragma once
#include <string>
#include <vector>

#include "planner/op_pricer.h"
#include "planner/search.h"

namespace megatune::tools {

// Splits a flag string as a shell would: white space separates words; single quotes keep their text as it
// is, double quotes too (a backslash escapes the next character outside single quotes). `flag` names the
// input in a UserError (an unterminated quote).
std::vector<std::string> split_flag_string(const std::string& text, const std::string& flag);

// The candidate `flags` describe (parallel and batch flags only: the model is the plan's), validated,
// simulated with the request's options and sized by its memory model. UserError naming --against and the
// fix for flags plan would not take, another world size or global batch, or a layout Megatron refuses.
planner::PlanCandidate against_candidate(const std::string& flags, const planner::PlanRequest& request,
                                         const planner::OpPricer& pricer);

}  // namespace megatune::tools
