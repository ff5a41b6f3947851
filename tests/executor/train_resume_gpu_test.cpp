// Resume on the CUDA backend: a run that saves after k iterations and a fresh run (new backend, trainer and
// data loader) that loads the checkpoint continue the uninterrupted run's loss trajectory. Bitwise where the
// CUDA path is deterministic: at seq 64 every (batch, kv head) has one attention key block, so each dQ
// element receives exactly one fp32 atomic add (both backward kernels reduce over a block's key rows before
// their atomics). At seq 512 several key blocks add into each dQ element in whatever order they land, so
// runs differ in the last bits; there the resumed run must stay within a tight band of the straight run.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "executor/cuda/cuda_backend.h"
#include "executor/parallel/communicator.h"
#include "executor/training/training_run.h"
#include "tests/executor/small_models.h"

namespace megatune::executor {
namespace {

constexpr std::int64_t kVocab = 512;

// A 2-layer model of GPT shape (LayerNorm, GELU, learned positions, biases, tied head) or Llama shape
// (RMSNorm, SwiGLU, RoPE, GQA 4/2, no biases, untied head) on Megatron-style mock data. `schedule_iters`
// fixes the LR schedule (warm-up then cosine decay) so both halves of a resumed run share it.
RunConfig small_run(bool llama, std::int64_t seq, std::int64_t train_iters, std::int64_t schedule_iters) {
  RunConfig run;
  TrainerConfig& c = run.trainer;
  c.model = test::two_layer_model(llama, kVocab, seq);
  c.batch.micro_batch = 2;
  c.batch.seq = seq;
  c.batch.num_microbatches = 2;
  c.compute_dtype = DType::kBF16;
  c.lr.max_lr = 3e-3;
  c.lr.min_lr = 3e-4;
  c.lr.style = LrDecayStyle::kCosine;
  c.lr.warmup_samples = 2 * c.global_batch_size();
  c.lr.decay_samples = schedule_iters * c.global_batch_size();
  run.train_iters = train_iters;
  run.data.mock_data = true;
  run.data.gpt.vocab_size = kVocab;
  run.data.gpt.eod_token = 0;
  run.data.mock.vocab_size = kVocab;
  run.data.mock.max_sequence_length = 200;
  run.data.mock.num_sequences = 2000;
  run.log_interval = 1000;
  return run;
}

std::vector<IterationRecord> train_on_cuda(const RunConfig& config, std::string* log_text = nullptr) {
  CudaBackend backend(0);
  SingleRankCommunicator communicator(backend);
  std::ostringstream log;
  TrainingRun run(config, backend, communicator, log);
  std::vector<IterationRecord> records = run.run();
  if (log_text) *log_text = log.str();
  return records;
}

std::filesystem::path fresh_directory(const std::string& tag) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("megatune_resume_gpu_" + tag + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  return dir;
}

struct ResumedRun {
  std::vector<IterationRecord> straight, first_half, second_half;
};

// Straight for 2k iterations; then k iterations saving at the end, and a new run loading it up to 2k.
ResumedRun run_with_resume(bool llama, std::int64_t seq, int k, const std::string& tag) {
  const std::filesystem::path root = fresh_directory(tag);
  ResumedRun r;
  r.straight = train_on_cuda(small_run(llama, seq, 2 * k, 2 * k));
  RunConfig first = small_run(llama, seq, k, 2 * k);
  first.save = root.string();
  r.first_half = train_on_cuda(first);
  RunConfig second = small_run(llama, seq, 2 * k, 2 * k);
  second.load = root.string();
  std::string log;
  r.second_half = train_on_cuda(second, &log);
  EXPECT_NE(log.find("loaded checkpoint"), std::string::npos) << log;
  std::filesystem::remove_all(root);
  return r;
}

void expect_bitwise_resume(bool llama) {
  if (CudaBackend::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const int k = 5;
  const std::int64_t seq = 64;  // one key block: the CUDA path is deterministic
  const ResumedRun r = run_with_resume(llama, seq, k, llama ? "llama" : "gpt");
  // The precondition: two uninterrupted runs agree bitwise.
  const std::vector<IterationRecord> again = train_on_cuda(small_run(llama, seq, 2 * k, 2 * k));
  ASSERT_EQ(r.straight.size(), std::size_t(2 * k));
  ASSERT_EQ(again.size(), std::size_t(2 * k));
  for (int i = 0; i < 2 * k; ++i)
    ASSERT_EQ(again[i].step.loss, r.straight[i].step.loss)
        << "iteration " << i + 1 << ": the CUDA path is not deterministic at seq " << seq;
  ASSERT_EQ(r.first_half.size(), std::size_t(k));
  ASSERT_EQ(r.second_half.size(), std::size_t(k));
  for (int i = 0; i < k; ++i) {
    EXPECT_EQ(r.first_half[i].step.loss, r.straight[i].step.loss) << "iteration " << i + 1;
    const IterationRecord& resumed = r.second_half[i];
    const IterationRecord& want = r.straight[k + i];
    EXPECT_EQ(resumed.iteration, k + i + 1);
    EXPECT_EQ(resumed.step.loss, want.step.loss) << "iteration " << k + i + 1;
    EXPECT_EQ(resumed.step.grad_norm, want.step.grad_norm) << "iteration " << k + i + 1;
    EXPECT_EQ(resumed.step.learning_rate, want.step.learning_rate) << "iteration " << k + i + 1;
    EXPECT_FALSE(resumed.step.skipped);
  }
  // It trained: the loss moved from near log(vocab).
  EXPECT_NEAR(r.straight.front().step.loss, std::log(double(kVocab)), 0.3);
  EXPECT_LT(r.straight.back().step.loss, r.straight.front().step.loss - 0.05);
}

TEST(TrainResumeGpu, GptShapeResumesBitwiseAtOneKeyBlock) { expect_bitwise_resume(false); }
TEST(TrainResumeGpu, LlamaShapeResumesBitwiseAtOneKeyBlock) { expect_bitwise_resume(true); }

TEST(TrainResumeGpu, ResumeTracksTheStraightRunWhenDqAtomicsReorder) {
  if (CudaBackend::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  // seq 512: 4 (128-row) to 8 (64-row) key blocks add into each dQ element; fp32 addition order changes the
  // last bits, which bf16 dQ sometimes keeps, so two straight runs may already differ slightly. The resumed
  // run must stay within the same tight band: losses within 2e-3 relative, gradient norms within 2e-2.
  const int k = 5;
  const std::int64_t seq = 512;
  const ResumedRun r = run_with_resume(true, seq, k, "llama512");
  const std::vector<IterationRecord> again = train_on_cuda(small_run(true, seq, 2 * k, 2 * k));
  ASSERT_EQ(r.second_half.size(), std::size_t(k));
  double worst_resume = 0, worst_rerun = 0;
  for (int i = 0; i < 2 * k; ++i) {
    const double want = r.straight[i].step.loss;
    worst_rerun = std::max(worst_rerun, std::fabs(again[i].step.loss - want) / want);
    EXPECT_NEAR(again[i].step.loss, want, 2e-3 * want) << "rerun, iteration " << i + 1;
  }
  for (int i = 0; i < k; ++i) {
    const IterationRecord& resumed = r.second_half[i];
    const StepResult& want = r.straight[k + i].step;
    worst_resume = std::max(worst_resume, std::fabs(resumed.step.loss - want.loss) / want.loss);
    EXPECT_EQ(resumed.iteration, k + i + 1);
    EXPECT_EQ(resumed.step.learning_rate, want.learning_rate);
    EXPECT_NEAR(resumed.step.loss, want.loss, 2e-3 * want.loss) << "iteration " << k + i + 1;
    EXPECT_NEAR(resumed.step.grad_norm, want.grad_norm, 2e-2 * want.grad_norm) << "iteration " << k + i + 1;
    EXPECT_FALSE(resumed.step.skipped);
  }
  std::printf("seq %lld: worst relative loss deviation, resumed %.2e, straight rerun %.2e\n",
              static_cast<long long>(seq), worst_resume, worst_rerun);
}

}  // namespace
}  // namespace megatune::executor
