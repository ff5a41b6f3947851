// The trainer's schedule glue: the step items of an iteration without a walk (a single rank), the
// no-pipelining schedule of one stage, and the activation slots each model chunk needs under a schedule.
#pragma once
#include <vector>

#include "executor/model/parameter_layout.h"  // StageSpan
#include "layouts/schedule.h"
#include "layouts/schedule_walker.h"

namespace megatune::executor {

// The no-pipelining schedule (layouts::build_rank_schedule over one uniform stage) of m micro-batches.
layouts::RankSchedule single_stage_schedule(int num_layers, int num_microbatches);
// Activation slots each model chunk needs under `schedule`: the most micro-batches of the chunk whose
// activation arrived (or forward ran) and whose backward, and the send of its input gradient, have not.
std::vector<int> activation_slots_per_chunk(const layouts::RankSchedule& schedule,
                                            const std::vector<StageSpan>& chunks);
// The items of an iteration without a walk: the schedule's own (a single rank: no p2p, no buckets), then the
// grad norm and AdamW. `chunks` are resolved (every num_layers set); the loss stage holds the MTP layers.
std::vector<layouts::StepItem> items_from_schedule(const layouts::RankSchedule& schedule,
                                                   const std::vector<StageSpan>& chunks, int mtp_num_layers);

}  // namespace megatune::executor
