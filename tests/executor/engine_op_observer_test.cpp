// Backend::set_op_observer on the CPU backend training `tiny`: the observer sees exactly the recorded ops,
// in order, with consecutive indices and balanced begin/end, independent of recording, and nothing once
// detached.
#include <gtest/gtest.h>

#include <random>

#include "executor/cpu/cpu_backend.h"
#include "executor/parallel/communicator.h"
#include "executor/training/trainer.h"
#include "layouts/model_spec.h"
#include "layouts/parallel_config.h"

namespace megatune::executor {
namespace {

class CheckingObserver : public Backend::OpObserver {
 public:
  void op_begin(std::size_t op_index, const layouts::Op& op) override {
    if (open) ++nested;
    if (op_index != ops.size()) ++bad_indices;
    ops.push_back(op);
    open = true;
  }
  void op_end() override {
    if (!open) ++unbalanced_ends;
    open = false;
    ++ends;
  }
  std::vector<layouts::Op> ops;
  bool open = false;
  int nested = 0, bad_indices = 0, unbalanced_ends = 0, ends = 0;
};

struct TinyTrainer {
  TinyTrainer() : backend(true), communicator(backend) {
    const layouts::ModelSpec spec = layouts::model_preset("tiny");
    layouts::ParallelConfig parallel;
    parallel.micro_batch_size = 2;
    parallel.global_batch_size = 4;
    parallel.validate(spec);
    TrainerConfig config;
    config.model = transformer_config_from(spec, 1, 10000.0f, 1e-5f, 0.02f);
    config.batch.micro_batch = 2;
    config.batch.seq = spec.seq_length;
    config.batch.num_microbatches = 2;
    config.compute_dtype = DType::kBF16;
    config.lr.decay_samples = 1000;  // a finite schedule: every step applies the optimizer
    trainer =
        std::make_unique<Trainer>(config, layouts::build_schedule(spec, parallel, 0), backend, communicator);
    std::mt19937 rng(3);
    batches.resize(2);
    for (MicroBatch& mb : batches)
      for (std::int64_t t = 0; t < config.batch.micro_batch * config.batch.seq; ++t) {
        mb.tokens.push_back(static_cast<std::int32_t>(rng() % spec.vocab_size));
        mb.labels.push_back(static_cast<std::int32_t>(rng() % spec.vocab_size));
        mb.loss_mask.push_back(1.0f);
      }
  }
  CpuBackend backend;
  SingleRankCommunicator communicator;
  std::unique_ptr<Trainer> trainer;
  std::vector<MicroBatch> batches;
};

TEST(EngineOpObserver, SeesExactlyTheRecordedOpsInOrderWithBalancedCalls) {
  TinyTrainer t;
  CheckingObserver observer;
  t.backend.recorder().set_enabled(true);
  t.backend.set_op_observer(&observer);
  t.trainer->train_step(t.batches);
  t.backend.set_op_observer(nullptr);
  const std::vector<layouts::Op>& recorded = t.backend.recorder().ops();
  ASSERT_FALSE(recorded.empty());
  ASSERT_EQ(observer.ops.size(), recorded.size());
  for (std::size_t i = 0; i < recorded.size(); ++i) {
    EXPECT_TRUE(observer.ops[i].same_work(recorded[i]) &&
                observer.ops[i].microbatch == recorded[i].microbatch &&
                observer.ops[i].layer == recorded[i].layer && observer.ops[i].label == recorded[i].label)
        << "op " << i << ": observed " << layouts::to_string(observer.ops[i]) << ", recorded "
        << layouts::to_string(recorded[i]);
  }
  EXPECT_EQ(observer.ends, static_cast<int>(recorded.size()));
  EXPECT_FALSE(observer.open);
  EXPECT_EQ(observer.nested, 0);
  EXPECT_EQ(observer.bad_indices, 0);
  EXPECT_EQ(observer.unbalanced_ends, 0);
}

TEST(EngineOpObserver, WorksWithoutRecordingRestartsIndicesAndStopsWhenDetached) {
  TinyTrainer t;
  CheckingObserver first;
  t.backend.set_op_observer(&first);
  t.trainer->train_step(t.batches);
  EXPECT_TRUE(t.backend.recorder().ops().empty());  // recording stays off
  ASSERT_FALSE(first.ops.empty());
  EXPECT_EQ(first.bad_indices, 0);
  EXPECT_EQ(first.ends, static_cast<int>(first.ops.size()));

  CheckingObserver second;  // a new observer counts from 0 again; the same step issues the same ops
  t.backend.set_op_observer(&second);
  t.trainer->train_step(t.batches);
  t.backend.set_op_observer(nullptr);
  EXPECT_EQ(second.bad_indices, 0);
  ASSERT_EQ(second.ops.size(), first.ops.size());
  for (std::size_t i = 0; i < first.ops.size(); ++i) EXPECT_TRUE(second.ops[i].same_work(first.ops[i])) << i;

  const std::size_t seen = second.ops.size();
  t.trainer->train_step(t.batches);
  EXPECT_EQ(second.ops.size(), seen);
  EXPECT_EQ(first.ops.size(), seen);
}

}  // namespace
}  // namespace megatune::executor
