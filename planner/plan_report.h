// Plan reports: the ranked table, the plan as JSON, as `megatune train` arguments and as Megatron-LM
// pretrain_gpt.py arguments.
#pragma once
#include <string>
#include <vector>

#include "cost_models/cluster_spec.h"
#include "layouts/model_spec.h"
#include "planner/search.h"

namespace megatune::planner {

// Aligned table of the ranked candidates: rank, layout string and knobs, predicted step time, MFU, tokens/s,
// peak memory vs capacity, bubble, exposed communication.
std::string format_plan_table(const PlanResult& result);

// Every field of a model on one line (the name, its shape, MoE layer kinds, the parameter count): `plan` and
// `train --dry-run` print it, so a plan's emitted command can be checked to build the planned model.
std::string describe_model(const layouts::ModelSpec& model);

// A layout's every setting on one line (sizes, stages, batch, recomputation, microbatch group, rank order,
// dispatcher, overlaps): `plan` prints its winner's, `train --dry-run` the one its flags give.
std::string describe_run_settings(const layouts::ModelSpec& model, const layouts::ParallelConfig& config);

// Parallel + batch flags (Megatron names) of a candidate, e.g. "--tensor-model-parallel-size 8 ...".
std::vector<std::string> parallel_arguments(const PlanCandidate& candidate);
// `megatune train [--model <preset>] <every model shape flag> --world-size N <parallel flags>`: the whole
// model (a preset's overrides included) and layout.
std::vector<std::string> megatune_train_arguments(const layouts::ModelSpec& model,
                                                  const PlanCandidate& candidate);
// pretrain_gpt.py flags: the model shape spelled out, parallel and batch flags, bf16 and the overlaps.
std::vector<std::string> megatron_arguments(const layouts::ModelSpec& model, const PlanCandidate& candidate);
// One shell line: arguments quoted where needed.
std::string shell_join(const std::string& program, const std::vector<std::string>& arguments);

// One candidate's knobs and prediction as a one-line JSON object.
std::string candidate_json(const PlanCandidate& candidate);

// The plan as JSON: model, cluster, the winner (config, layout, prediction, memory items, per-kind
// times, provenance) and the ranked alternatives. `train_flags` and `megatron_flags` (the settings every
// candidate ran with: FP8, the gradient dtype, overlaps) follow the winner's megatune train and Megatron-LM
// arguments.
std::string plan_json(const layouts::ModelSpec& model, const cost_models::ClusterSpec& cluster,
                      const PlanResult& result, const MemoryEstimate& winner_memory,
                      const std::vector<std::string>& train_flags = {},
                      const std::vector<std::string>& megatron_flags = {});

}  // namespace megatune::planner
