// libFuzzer target: Megatron layout strings + parallel configurations. Bad input must end in UserError;
// accepted input must round-trip through the canonical string and schedule without deadlock.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "base/user_error.h"
#include "layouts/parallel_config.h"
#include "layouts/pipeline_layout.h"
#include "layouts/schedule.h"
#include "layouts/schedule_replay.h"

namespace {

using namespace megatune::layouts;

// Input: 12 configuration bytes, then the layout string.
struct Bytes {
  const uint8_t* data;
  size_t size;
  size_t pos = 0;
  int next() { return pos < size ? data[pos++] : 0; }
};

void check(bool condition) {
  if (!condition) std::abort();
}

void exercise(const uint8_t* data, size_t size) {
  Bytes in{data, size};
  const int pp = 1 + in.next() % 16;
  const int num_layers = 1 + in.next() % 96;
  const int mtp = in.next() % 3;
  const int tp = 1 << (in.next() % 4);
  const int cp = 1 << (in.next() % 3);
  const int dp = 1 + in.next() % 4;
  const int mbs = 1 + in.next() % 4;
  const int gbs_factor = in.next() % 40;  // 0: Megatron's default
  const int group = in.next() % 20;
  const int flags = in.next();
  const int expert_selector = in.next();
  const int expert_exponent = in.next();
  const int experts = expert_selector % 3 == 0 ? 0 : 1 << (expert_exponent % 4);
  const std::string text(reinterpret_cast<const char*>(data) + in.pos, size - in.pos);

  // 1. The grammar alone.
  try {
    const PipelineLayout layout = PipelineLayout::parse(text, pp);
    check(layout.num_stages() % pp == 0);
    const PipelineLayout again = PipelineLayout::parse(layout.to_string(), pp);
    check(again == layout);
    check(PipelineLayout::parse(layout.expanded_string(), pp) == layout);
    layout.validate(num_layers, mtp);
  } catch (const megatune::UserError&) {
  }

  // 2. The whole configuration with that layout (or a derived one when the flags say so).
  ModelSpec model = model_preset("tiny");
  model.num_layers = num_layers;
  model.mtp_num_layers = mtp;
  model.num_attention_heads = 8;
  model.num_query_groups = 4;
  model.hidden_size = 64;
  model.seq_length = 64;
  model.num_experts = experts;
  model.moe_router_topk = experts > 0 ? 1 : 2;
  ParallelConfig config;
  config.tensor_model_parallel_size = tp;
  config.context_parallel_size = cp;
  config.pipeline_model_parallel_size = pp;
  config.expert_model_parallel_size = experts > 1 && (flags & 1) ? 2 : 1;
  config.world_size = tp * cp * pp * dp;
  config.micro_batch_size = mbs;
  config.global_batch_size = gbs_factor * mbs * dp;
  config.microbatch_group_size_per_vp_stage = group;
  config.sequence_parallel = flags & 2;
  config.overlap_p2p_comm = flags & 4;
  if (flags & 8) {
    config.pipeline_model_parallel_layout = text;
  } else if (flags & 16) {
    config.decoder_first_pipeline_num_layers = in.next() % 8;
    config.decoder_last_pipeline_num_layers = (flags & 32) ? in.next() % 8 : -1;
  } else if (flags & 32) {
    config.account_for_embedding_in_pipeline_split = flags & 64;
    config.account_for_loss_in_pipeline_split = true;
  }
  if (flags & 128) config.num_virtual_stages_per_pipeline_rank = 1 + in.next() % 4;
  try {
    config.validate(model);
    const PipelineLayout layout = config.resolved_pipeline_layout(model);
    if (int64_t{config.num_microbatches()} * layout.vpp() * layout.pp() > 20'000) return;  // keep runs short
    std::vector<RankSchedule> schedules;
    for (int r = 0; r < layout.pp(); ++r) schedules.push_back(build_schedule(model, config, r));
    check(replay_schedules(schedules, layout).ok);
  } catch (const megatune::UserError&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  exercise(data, size);
  return 0;
}
