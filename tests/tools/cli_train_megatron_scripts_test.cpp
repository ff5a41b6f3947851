// Megatron-LM's example training scripts, pasted into `megatune train`: the flags each passes to
// pretrain_gpt.py (GPT-3 175B, Llama 3 8B in FP8, Mixtral 8x7B, DeepSeek-V3 under Megatron FSDP; variables
// at the scripts' defaults) either run (checked with --dry-run: the same checks as a real run) or are
// refused in one line naming the flag; with the refused ones dropped, each script's layout sizes. Beside
// them, the flags that change a run: sample-based schedules, --exit-interval / --exit-duration-in-mins with
// their checkpoint, --rampup-batch-size (the GPT-3 script before step schedules, a tiny run), --decoupled-lr
// / --decoupled-min-lr, --rotary-scaling-factor (MLA's YaRN), --finetune / --no-load-optim, --nproc as the
// world size, --recompute-activations, NullTokenizer, --calculate-per-token-loss and --tensorboard-dir (read
// back).
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "executor/training/tensorboard_writer.h"
#include "tests/tools/cli_harness.h"

namespace megatune::tests {
namespace {

using Flags = std::vector<std::string>;

Flags operator+(Flags a, const Flags& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// `flags` without each named flag and the values after it.
Flags without(const Flags& flags, const std::set<std::string>& names) {
  Flags out;
  bool skipping = false;
  for (const std::string& f : flags) {
    if (f.rfind("--", 0) == 0) skipping = names.count(f) > 0;
    if (!skipping) out.push_back(f);
  }
  return out;
}

// clang-format off: the scripts' flags, a few to a line
// examples/gpt3/train_gpt3_175b_distributed.sh
Flags gpt3_175b(const std::string& ckpt) {
  return {"--num-layers", "96", "--hidden-size", "12288", "--num-attention-heads", "96", "--seq-length",
          "2048", "--max-position-embeddings", "2048", "--attention-backend", "auto", "--micro-batch-size",
          "1", "--global-batch-size", "1536", "--step-batch-size-schedule",
          "0:16 2.4B:320 4.8B:624 7.2B:928 9.6B:1232 12B:1536", "--train-iters", "500000", "--weight-decay",
          "0.1", "--adam-beta1", "0.9", "--adam-beta2", "0.95", "--init-method-std", "0.006", "--clip-grad",
          "1.0", "--fp16", "--lr", "6.0e-5", "--lr-decay-style", "cosine", "--min-lr", "6.0e-6",
          "--lr-warmup-fraction", ".001", "--lr-decay-iters", "430000", "--tensor-model-parallel-size", "8",
          "--pipeline-model-parallel-size", "16", "--data-path", "corpus_text_document", "--split", "949,50,1",
          "--log-interval", "100", "--save-interval", "10000", "--eval-interval", "1000", "--save", ckpt,
          "--load", ckpt, "--eval-iters", "10", "--tensorboard-dir", ckpt + "/tb"};
}

// examples/llama/train_llama3_8b_h100_fp8.sh with its mock data (TOKENIZER_ARG / DATA_ARG "MOCK").
Flags llama3_8b_fp8(const std::string& ckpt) {
  return {"--use-mcore-models", "--num-layers", "32", "--hidden-size", "4096", "--ffn-hidden-size", "14336",
          "--num-attention-heads", "32", "--group-query-attention", "--num-query-groups", "8", "--kv-channels",
          "128", "--seq-length", "8192", "--max-position-embeddings", "8192", "--position-embedding-type",
          "rope", "--rotary-base", "1000000", "--rotary-percent", "1.0", "--attention-dropout", "0.0",
          "--hidden-dropout", "0.0", "--swiglu", "--normalization", "RMSNorm", "--init-method-std", "0.0134",
          "--attention-backend", "fused", "--apply-layernorm-1p", "--untie-embeddings-and-output-weights",
          "--disable-bias-linear", "--micro-batch-size", "1", "--global-batch-size", "128", "--train-samples",
          "1953125000", "--lr-decay-samples", "1949218748", "--lr-warmup-samples", "3906252", "--lr",
          "0.00015", "--min-lr", "0.00001", "--decoupled-lr", "5.0e-4", "--decoupled-min-lr", "4.5e-5",
          "--lr-decay-style", "cosine", "--clip-grad", "1.0", "--weight-decay", "0.1", "--adam-beta1", "0.9",
          "--adam-beta2", "0.95", "--bf16", "--grad-reduce-in-bf16", "--cross-entropy-loss-fusion",
          "--calculate-per-token-loss", "--manual-gc", "--empty-unused-memory-level", "1",
          "--exit-duration-in-mins", "235", "--use-distributed-optimizer", "--overlap-grad-reduce",
          "--overlap-param-gather", "--fp8-format", "hybrid", "--fp8-amax-history-len", "1024",
          "--fp8-amax-compute-algo", "max", "--fp8-param-gather", "--tensor-model-parallel-size", "1",
          "--context-parallel-size", "1", "--sequence-parallel", "--mock-data", "--tokenizer-type",
          "NullTokenizer", "--vocab-size", "128256", "--data-cache-path", ckpt + "/cache",
          "--tiktoken-pattern", "v2", "--split", "99,1,0", "--no-create-attention-mask-in-dataloader",
          "--no-mmap-bin-files", "--num-workers", "1", "--log-interval", "1", "--eval-iters", "32",
          "--eval-interval", "100", "--save-interval", "1000", "--log-throughput", "--profile",
          "--profile-step-start", "4", "--profile-step-end", "6", "--ckpt-format", "torch_dist",
          "--distributed-timeout-minutes", "60", "--save", ckpt, "--load", ckpt, "--tensorboard-dir",
          ckpt + "/tb"};
}

// examples/mixtral/train_mixtral_8x7b_distributed.sh (4 nodes: its ep8 x pp4 needs 32 GPUs).
Flags mixtral_8x7b(const std::string& ckpt, const std::string& tokenizer_model) {
  return {"--use-mcore-models", "--disable-bias-linear", "--seq-length", "4096", "--max-position-embeddings",
          "32768", "--num-layers", "32", "--hidden-size", "4096", "--ffn-hidden-size", "14336",
          "--num-attention-heads", "32", "--init-method-std", "0.01", "--attention-dropout", "0.0",
          "--hidden-dropout", "0.0", "--normalization", "RMSNorm", "--position-embedding-type", "rope",
          "--swiglu", "--untie-embeddings-and-output-weights", "--group-query-attention", "--num-query-groups",
          "8", "--no-masked-softmax-fusion", "--no-position-embedding", "--rotary-base", "1000000",
          "--num-experts", "8", "--moe-router-topk", "2", "--moe-router-load-balancing-type", "aux_loss",
          "--moe-aux-loss-coeff", "1e-2", "--moe-grouped-gemm", "--moe-token-dispatcher-type", "alltoall",
          "--overlap-param-gather", "--overlap-grad-reduce", "--tokenizer-type", "Llama2Tokenizer",
          "--tokenizer-model", tokenizer_model, "--data-path", "corpus_text_document", "--split", "99990,8,2",
          "--micro-batch-size", "1", "--global-batch-size", "256", "--lr", "1e-4", "--train-iters", "500000",
          "--lr-decay-iters", "320000", "--lr-decay-style", "cosine", "--min-lr", "1.0e-5", "--weight-decay",
          "0.1", "--lr-warmup-iters", "500", "--clip-grad", "1.0", "--bf16", "--tensor-model-parallel-size",
          "1", "--pipeline-model-parallel-size", "4", "--expert-model-parallel-size", "8",
          "--use-distributed-optimizer", "--sequence-parallel", "--log-interval", "1", "--save-interval",
          "10000", "--eval-interval", "1000", "--eval-iters", "10", "--save", ckpt, "--load", ckpt,
          "--tensorboard-dir", ckpt + "/tensorboard", "--no-load-optim", "--no-load-rng", "--world-size", "32"};
}

// examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh (TP 1, EP 8, MBS 4, GBS 2048, Megatron FSDP
// optim_grads_params, no profiling, no wandb; 32 nodes).
Flags deepseek_v3_fsdp(const std::string& ckpt) {
  return {"--distributed-timeout-minutes", "60", "--tensor-model-parallel-size", "1",
          "--expert-model-parallel-size", "8", "--expert-tensor-parallel-size", "1", "--context-parallel-size",
          "1", "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
          "--use-mcore-models", "--sequence-parallel", "--use-flash-attn", "--disable-bias-linear",
          "--micro-batch-size", "4", "--global-batch-size", "2048", "--train-samples", "585937500",
          "--exit-duration-in-mins", "220", "--no-check-for-nan-in-loss-and-grad", "--manual-gc",
          "--manual-gc-interval", "10", "--recompute-granularity", "selective", "--recompute-modules", "mlp",
          "moe", "mla_up_proj", "layernorm", "--transformer-impl", "transformer_engine", "--seq-length",
          "4096", "--data-cache-path", ckpt + "/cache", "--tokenizer-type", "HuggingFaceTokenizer",
          "--tokenizer-model", "deepseek-ai/DeepSeek-V3", "--data-path", "corpus_text_document", "--split",
          "99,1,0", "--no-mmap-bin-files", "--no-create-attention-mask-in-dataloader", "--num-workers", "6",
          "--num-layers", "61", "--hidden-size", "7168", "--ffn-hidden-size", "18432", "--num-attention-heads",
          "128", "--kv-channels", "128", "--max-position-embeddings", "4096", "--position-embedding-type",
          "rope", "--rotary-base", "10000", "--make-vocab-size-divisible-by", "3232", "--normalization",
          "RMSNorm", "--norm-epsilon", "1e-6", "--swiglu", "--untie-embeddings-and-output-weights",
          "--multi-latent-attention", "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--clip-grad",
          "1.0", "--weight-decay", "0.1", "--qk-layernorm", "--lr-decay-samples", "584765624",
          "--lr-warmup-samples", "1536000", "--lr-warmup-init", "3.9e-7", "--lr", "3.9e-6", "--min-lr",
          "3.9e-7", "--lr-decay-style", "cosine", "--adam-beta1", "0.9", "--adam-beta2", "0.95",
          "--num-experts", "256", "--moe-layer-freq", "[0]*3+[1]*58", "--moe-ffn-hidden-size", "2048",
          "--moe-shared-expert-intermediate-size", "2048", "--moe-router-load-balancing-type", "seq_aux_loss",
          "--moe-router-topk", "8", "--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend",
          "hybridep", "--moe-router-pre-softmax", "--moe-grouped-gemm", "--moe-aux-loss-coeff", "1e-4",
          "--moe-router-group-topk", "4", "--moe-router-num-groups", "8", "--moe-router-topk-scaling-factor",
          "2.5", "--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias",
          "--moe-router-bias-update-rate", "1e-3", "--moe-router-dtype", "fp32", "--moe-permute-fusion",
          "--moe-router-force-load-balancing", "--q-lora-rank", "1536", "--kv-lora-rank", "512",
          "--qk-head-dim", "128", "--qk-pos-emb-head-dim", "64", "--v-head-dim", "128",
          "--rotary-scaling-factor", "40", "--mscale", "1.0", "--mscale-all-dim", "1.0", "--mtp-num-layers",
          "1", "--mtp-loss-scaling-factor", "0.1", "--eval-iters", "32", "--eval-interval", "100",
          "--auto-detect-ckpt-format", "--load", ckpt, "--save", ckpt, "--save-interval", "100",
          "--dist-ckpt-strictness", "log_all", "--init-method-std", "0.02", "--log-timers-to-tensorboard",
          "--log-memory-to-tensorboard", "--log-num-zeros-in-grad", "--log-params-norm",
          "--log-validation-ppl-to-tensorboard", "--log-throughput", "--log-interval", "1", "--logging-level",
          "40", "--tensorboard-dir", ckpt + "/tensorboard", "--bf16", "--enable-experimental",
          "--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params",
          "--no-gradient-accumulation-fusion", "--use-distributed-optimizer", "--calculate-per-token-loss",
          "--init-model-with-meta-device", "--ckpt-format", "fsdp_dtensor", "--fsdp-double-buffer",
          "--use-nccl-ub", "--megatron-fsdp-grad-comm-dtype", "bf16", "--megatron-fsdp-main-grads-dtype",
          "bf16", "--world-size", "256"};
}

// clang-format on

CliResult train_dry(const Flags& flags) {
  // Megatron starts afresh at a --load that holds nothing; megatune refuses one that does not exist (a
  // typo), so each script's checkpoint directory is made first.
  for (std::size_t i = 0; i + 1 < flags.size(); ++i)
    if (flags[i] == "--load") std::filesystem::create_directories(flags[i + 1]);
  // The CUDA backend's sizing (it counts, allocates nothing): the scripts' models are far too large to lay
  // out on the host.
  return run_megatune(Flags{"train", "--device", "cuda", "--dry-run"} + flags, 300);
}

void expect_one_line_refusal(const CliResult& r, const std::string& first,
                             const std::vector<std::string>& also) {
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_EQ(r.error_lines(), 1) << r.err;
  EXPECT_EQ(r.err.rfind("megatune train: " + first, 0), 0u) << r.err;
  for (const std::string& flag : also)
    EXPECT_NE(r.err.find(flag), std::string::npos) << flag << "\n" << r.err;
}

void expect_sized(const CliResult& r, const std::vector<std::string>& named) {
  EXPECT_FALSE(r.timed_out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("megatune train --dry-run:"), std::string::npos) << r.out;
  const std::size_t line = r.out.find("megatune train: Megatron flags taken as given");
  ASSERT_NE(line, std::string::npos) << r.out;
  const std::string accepted = r.out.substr(line, r.out.find('\n', line) - line);
  for (const std::string& flag : named)
    EXPECT_NE(accepted.find(flag), std::string::npos) << flag << "\n" << accepted;
}

TEST(MegatronScripts, Gpt3RefusesFp16AndStepScheduleThenSizes) {
  TempDir dir;
  const Flags pasted = gpt3_175b(dir / "ckpt");
  expect_one_line_refusal(train_dry(pasted), "--step-batch-size-schedule 0:16", {"--fp16"});
  // Its GPT-2 vocabulary comes from the tokenizer files; here from --vocab-size (no files are written).
  expect_sized(
      train_dry(without(pasted, {"--step-batch-size-schedule", "--fp16"}) + Flags{"--vocab-size", "50257"}),
      {"--attention-backend auto"});
}

TEST(MegatronScripts, Gpt3RampupNeedsSamplesThenSizesAndStatesTheRamp) {
  // The script before Megatron's step schedules: --rampup-batch-size 16 16 5859375 with --train-iters, which
  // Megatron asserts against (expected no batch-size rampup for iteration-based training).
  TempDir dir;
  Flags pasted = without(gpt3_175b(dir / "ckpt"), {"--step-batch-size-schedule", "--fp16"}) +
                 Flags{"--vocab-size", "50257", "--rampup-batch-size", "16", "16", "5859375"};
  expect_one_line_refusal(train_dry(pasted), "--rampup-batch-size needs a sample-based run",
                          {"--train-samples"});
  // Sample-based (300B tokens of 2048): sizes, and the dry run states the ramp and its iterations.
  const Flags samples = without(pasted, {"--train-iters", "--lr-decay-iters"}) +
                        Flags{"--train-samples", "146484375", "--lr-decay-samples", "125000000"};
  const CliResult r = train_dry(samples);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("batch-size ramp-up: global batch 16 -> 1536 in steps of 16 over 5859375 samples (95 "
                       "increments"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("111354 iterations for --train-samples 146484375"), std::string::npos) << r.out;
  // An increment that does not divide the interval: Megatron's assert, in one line.
  expect_one_line_refusal(train_dry(without(samples, {"--rampup-batch-size"}) +
                                    Flags{"--rampup-batch-size", "16", "100", "5859375"}),
                          "--rampup-batch-size 16 100 5859375: the global batch size interval (1520) is not "
                          "divisible by the batch size increment (100)",
                          {});
}

TEST(MegatronScripts, Llama3RefusesFp8ParamGatherThenSizesInFp8) {
  TempDir dir;
  const Flags pasted = llama3_8b_fp8(dir / "ckpt");
  const CliResult refused = train_dry(pasted);
  expect_one_line_refusal(refused, "--fp8-param-gather", {});
  EXPECT_EQ(refused.err.find("--decoupled-lr"), std::string::npos) << refused.err;  // it runs
  // Its FP8 recipe (hybrid, delayed scaling over an amax history of 1024, max) runs.
  const Flags runnable = without(pasted, {"--fp8-param-gather"});
  const CliResult r = train_dry(runnable);
  EXPECT_NE(r.out.find("fp8 hybrid delayed"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("FP8 weight copies"), std::string::npos) << r.out;
  expect_sized(r, {"--use-mcore-models", "--rotary-percent 1.0", "--attention-dropout 0.0", "--manual-gc",
                   "--grad-reduce-in-bf16", "--apply-layernorm-1p", "--calculate-per-token-loss",
                   "--ckpt-format torch_dist", "--profile"});
  // NullTokenizer: ids below 128256 and EOD 128256 (Megatron pads the 128257 to a multiple of 128).
  EXPECT_NE(r.out.find("vocab 128257 (multiple 128)"), std::string::npos) << r.out;
}

TEST(MegatronScripts, MixtralRunsAsPasted) {
  TempDir dir;
  // Llama2Tokenizer needs a SentencePiece model: a small one trained here when Debian's spm_train is there.
  const std::string corpus = dir / "corpus.txt";
  std::string text;
  for (int i = 0; i < 200; ++i)
    text += "the quick brown fox " + std::to_string(i) + " jumps over the lazy dog\n";
  write_text(corpus, text);
  const std::string command = "spm_train --input=" + corpus + " --model_prefix=" + (dir / "sp") +
                              " --vocab_size=60 --model_type=bpe --minloglevel=2 > /dev/null 2>&1";
  const bool have_model = std::system(command.c_str()) == 0;
  const Flags pasted = mixtral_8x7b(dir / "ckpt", dir / "sp.model");
  if (!have_model) GTEST_SKIP() << "spm_train not found (Debian package sentencepiece)";
  expect_sized(train_dry(pasted), {"--moe-grouped-gemm", "--no-masked-softmax-fusion", "--no-load-rng",
                                   "--no-position-embedding"});
}

TEST(MegatronScripts, DeepSeekV3NamesWhatItRefusesThenSizes) {
  TempDir dir;
  const Flags pasted = deepseek_v3_fsdp(dir / "ckpt");
  const CliResult refused = train_dry(pasted);
  expect_one_line_refusal(refused, "--moe-flex-dispatcher-backend hybridep",
                          {"--moe-router-force-load-balancing", "--megatron-fsdp-grad-comm-dtype bf16"});
  EXPECT_EQ(refused.err.find("--rotary-scaling-factor"), std::string::npos);  // MLA's YaRN runs
  EXPECT_EQ(refused.err.find("--qk-layernorm"), std::string::npos);           // MLA's latent norms run
  // The hub name is not a tokenizer file here: the mock data's NullTokenizer at DeepSeek-V3's vocabulary.
  Flags rest = without(pasted, {"--moe-flex-dispatcher-backend", "--moe-router-force-load-balancing",
                                "--megatron-fsdp-grad-comm-dtype", "--megatron-fsdp-main-grads-dtype",
                                "--tokenizer-type", "--tokenizer-model"}) +
               Flags{"--tokenizer-type", "NullTokenizer", "--vocab-size", "129279"};
  // What the layout and model flags refuse next, one line each.
  const CliResult flex = train_dry(rest);
  EXPECT_EQ(flex.exit_code, 1);
  EXPECT_EQ(flex.error_lines(), 1) << flex.err;
  EXPECT_NE(flex.err.find("--moe-token-dispatcher-type 'flex'"), std::string::npos) << flex.err;
  rest = without(rest, {"--moe-token-dispatcher-type"});
  const CliResult modules = train_dry(rest);
  EXPECT_EQ(modules.error_lines(), 1) << modules.err;
  EXPECT_NE(modules.err.find("--recompute-modules mlp"), std::string::npos) << modules.err;
  rest = without(rest, {"--recompute-modules"});
  expect_sized(train_dry(rest), {"--use-flash-attn", "--moe-router-dtype fp32", "--log-params-norm",
                                 "--ckpt-format fsdp_dtensor"});
  // Megatron's MLA without --qk-layernorm has no latent norms; megatune's MLA always has them.
  const CliResult no_latent_norms = train_dry(without(rest, {"--qk-layernorm"}));
  EXPECT_EQ(no_latent_norms.exit_code, 1) << no_latent_norms.out;
  EXPECT_EQ(no_latent_norms.error_lines(), 1) << no_latent_norms.err;
  EXPECT_NE(no_latent_norms.err.find("--multi-latent-attention without --qk-layernorm"), std::string::npos)
      << no_latent_norms.err;
  EXPECT_NE(no_latent_norms.err.find("add --qk-layernorm"), std::string::npos) << no_latent_norms.err;
}

// The tiny model (or another preset) on the CPU backend (ranks as threads), for the flags that change a run.
Flags tiny(const Flags& more, const std::string& model = "tiny") {
  return Flags{"train", "--model", model, "--device",       "cpu", "--mock-data", "--gbs",
               "4",     "--mbs",   "2",   "--log-interval", "1"} +
         more;
}

double learning_rate_at(const std::string& log, int iteration) {
  std::istringstream in(log);
  char tag[32];
  std::snprintf(tag, sizeof(tag), "iteration %8d/", iteration);
  for (std::string line; std::getline(in, line);) {
    if (line.find(tag) == std::string::npos) continue;
    const std::size_t at = line.find("learning rate: ");
    return at == std::string::npos ? -1 : std::stod(line.substr(at + 15));
  }
  return -1;
}

TEST(MegatronFlags, SampleScheduleEqualsTheIterationOne) {
  // 40 samples of 4 = 10 iterations; warm-up 8 samples (2 iterations), decay over 32 (8 iterations).
  const CliResult samples = run_megatune(
      tiny({"--train-samples", "40", "--lr-warmup-samples", "8", "--lr-decay-samples", "32"}), 120);
  const CliResult iters =
      run_megatune(tiny({"--train-iters", "10", "--lr-warmup-iters", "2", "--lr-decay-iters", "8"}), 120);
  ASSERT_EQ(samples.exit_code, 0) << samples.err;
  ASSERT_EQ(iters.exit_code, 0) << iters.err;
  EXPECT_NE(samples.out.find("iteration       10/      10"), std::string::npos) << samples.out;
  for (int i : {1, 2, 5, 7}) {
    EXPECT_GT(learning_rate_at(samples.out, i), 0.0) << i;
    EXPECT_EQ(learning_rate_at(samples.out, i), learning_rate_at(iters.out, i)) << i;
  }
  // Warm-up in samples that no iteration divides: 6 samples, 1.5 iterations (Megatron counts samples).
  const CliResult odd = run_megatune(tiny({"--train-samples", "40", "--lr-warmup-samples", "6"}), 120);
  ASSERT_EQ(odd.exit_code, 0) << odd.err;
  EXPECT_NEAR(learning_rate_at(odd.out, 1), 1e-4 * 4 / 6, 1e-10);
  for (const auto& [flags, says] : std::vector<std::pair<Flags, std::string>>{
           {{"--train-iters", "5", "--train-samples", "40"},
            "give only one of --train-iters and --train-samples"},
           {{"--train-samples", "40", "--lr-decay-iters", "5"},
            "with --train-samples give --lr-decay-samples"},
           {{"--lr-warmup-samples", "8"}, "--lr-warmup-samples belongs to a sample-based schedule"},
           {{"--train-samples", "3"}, "--train-samples 3 is less than one global batch (4 samples)"}}) {
    const CliResult r = run_megatune(tiny(flags), 60);
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_EQ(r.error_lines(), 1) << r.err;
    EXPECT_NE(r.err.find(says), std::string::npos) << r.err;
  }
}

std::string loss_at(const std::string& log, int iteration) {
  char tag[32];
  std::snprintf(tag, sizeof(tag), "iteration %8d/", iteration);
  const std::size_t at = log.find(tag);
  return at == std::string::npos ? std::string() : log.substr(log.find("lm loss: ", at), 22);
}

TEST(MegatronFlags, RampupBatchSizeTrainsTheRamp) {
  // Global batch 2 for 8 samples, then 4 (--gbs 4 --mbs 2): 5 ramp-up iterations (Megatron counts them while
  // at most 8 samples were consumed), then (16 - 12) / 4 = 1.
  TempDir dir;
  const CliResult r = run_megatune(
      tiny({"--rampup-batch-size", "2", "2", "8", "--train-samples", "16", "--tensorboard-dir", dir / "tb"}),
      120);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("iteration        6/       6 | consumed samples:           16 |"), std::string::npos)
      << r.out;
  for (int i = 1; i <= 6; ++i) {
    const std::size_t at =
        r.out.find("iteration " + std::string(i < 10 ? "       " : "      ") + std::to_string(i) + "/");
    ASSERT_NE(at, std::string::npos) << i;
    const std::string batch = i <= 4 ? "global batch size:     2" : "global batch size:     4";
    EXPECT_NE(r.out.substr(at, r.out.find('\n', at) - at).find(batch), std::string::npos) << r.out;
  }
  EXPECT_NE(r.out.find("ramping up batch size from 2 to 4"), std::string::npos) << r.out;
  std::vector<float> batch_sizes;
  for (const auto& entry : std::filesystem::directory_iterator(dir / "tb"))
    for (const executor::ScalarEvent& e : executor::read_scalar_events(entry.path().string()))
      if (e.tag == "batch-size") batch_sizes.push_back(e.value);
  EXPECT_EQ(batch_sizes, (std::vector<float>{2, 2, 2, 2, 4, 4}));
}

TEST(MegatronFlags, DecoupledLrIsTheEmbeddingsOwnRate) {
  // --decoupled-lr 0: the tied embedding never moves, so the second loss differs from the plain run's; the
  // logged rate is the default group's, as Megatron logs it.
  const CliResult plain = run_megatune(tiny({"--train-iters", "3"}), 120);
  const CliResult frozen =
      run_megatune(tiny({"--train-iters", "3", "--decoupled-lr", "0", "--decoupled-min-lr", "0"}), 120);
  // Megatron reads --decoupled-min-lr only with --decoupled-lr.
  const CliResult floor_only = run_megatune(tiny({"--train-iters", "3", "--decoupled-min-lr", "0"}), 120);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  ASSERT_EQ(frozen.exit_code, 0) << frozen.err;
  ASSERT_EQ(floor_only.exit_code, 0) << floor_only.err;
  EXPECT_EQ(loss_at(frozen.out, 1), loss_at(plain.out, 1));
  EXPECT_NE(loss_at(frozen.out, 2), loss_at(plain.out, 2));
  EXPECT_EQ(loss_at(floor_only.out, 3), loss_at(plain.out, 3));
  for (int i : {1, 2}) {  // (the linear decay reaches --min-lr 0 at iteration 3)
    EXPECT_GT(learning_rate_at(frozen.out, i), 0.0) << i;
    EXPECT_EQ(learning_rate_at(frozen.out, i), learning_rate_at(plain.out, i)) << i;
  }
  for (const auto& [flags, says] : std::vector<std::pair<Flags, std::string>>{
           {{"--decoupled-lr", "-1"}, "--decoupled-lr -1 makes no sense"},
           {{"--decoupled-lr", "1e-4", "--decoupled-min-lr", "1e-3"},
            "--decoupled-min-lr 0.001 exceeds --decoupled-lr 0.0001"}}) {
    const CliResult bad = run_megatune(tiny(Flags{"--train-iters", "1"} + flags), 60);
    EXPECT_EQ(bad.exit_code, 1);
    EXPECT_EQ(bad.error_lines(), 1) << bad.err;
    EXPECT_NE(bad.err.find(says), std::string::npos) << bad.err;
  }
}

TEST(MegatronFlags, RotaryScalingFactorIsYarnOfMultiLatentAttention) {
  TempDir dir;
  const std::string mla = "tiny-deepseek-v3-mla";
  const Flags yarn = {"--rotary-scaling-factor", "40", "--mscale", "1.0", "--mscale-all-dim", "1.0"};
  const CliResult plain = run_megatune(tiny({"--train-iters", "2"}, mla), 120);
  const CliResult scaled =
      run_megatune(tiny(Flags{"--train-iters", "2", "--save", dir / "yarn"} + yarn, mla), 120);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  ASSERT_EQ(scaled.exit_code, 0) << scaled.err;
  EXPECT_NE(loss_at(scaled.out, 1), loss_at(plain.out, 1));  // the softmax scale and angles differ
  // The checkpoint records the scaling: a resume without model flags takes it; one with the model but
  // without the scaling is another model.
  const CliResult resumed =
      run_megatune(Flags{"train", "--load", dir / "yarn", "--device", "cpu", "--mock-data", "--gbs", "4",
                         "--mbs", "2", "--train-iters", "3"},
                   120);
  EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("iteration        3/"), std::string::npos) << resumed.out;
  const CliResult mismatch = run_megatune(tiny({"--train-iters", "3", "--load", dir / "yarn"}, mla), 120);
  EXPECT_EQ(mismatch.exit_code, 1) << mismatch.out;
  EXPECT_EQ(mismatch.error_lines(), 1) << mismatch.err;
  EXPECT_NE(mismatch.err.find("YaRN x40"), std::string::npos) << mismatch.err;
  const CliResult bad = run_megatune(tiny({"--train-iters", "1", "--rotary-scaling-factor", "-2"}, mla), 60);
  EXPECT_EQ(bad.error_lines(), 1) << bad.err;
  EXPECT_NE(bad.err.find("--rotary-scaling-factor -2"), std::string::npos) << bad.err;
}

TEST(MegatronFlags, ExitFlagsSaveThenStop) {
  TempDir dir;
  const CliResult r =
      run_megatune(tiny({"--train-iters", "10", "--exit-interval", "3", "--save", dir / "a", "--eval-iters",
                         "1", "--eval-interval", "100", "--save-interval", "2"}),
                   120);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("[exiting program at iteration 3] datetime: "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("iteration        4/"), std::string::npos) << r.out;
  EXPECT_EQ(read_text(dir / "a/latest_checkpointed_iteration.txt"), "3\n");
  EXPECT_EQ(r.out.find("on validation set"), std::string::npos) << r.out;  // no evaluation after an exit
  // The resumed run goes on from iteration 3 and stops at 6.
  const CliResult resumed = run_megatune(
      tiny({"--train-iters", "10", "--exit-interval", "3", "--save", dir / "a", "--load", dir / "a"}), 120);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("iteration        4/      10"), std::string::npos) << resumed.out;
  EXPECT_EQ(read_text(dir / "a/latest_checkpointed_iteration.txt"), "6\n");
  // A time limit already passed after the first iteration: save at 1 and stop, on two ranks alike.
  const CliResult timed = run_megatune(tiny({"--train-iters", "50", "--exit-duration-in-mins", "1e-9",
                                             "--save", dir / "b", "--tp", "2", "--nproc", "2"}),
                                       120);
  ASSERT_EQ(timed.exit_code, 0) << timed.err;
  EXPECT_NE(timed.out.find("[exiting program after "), std::string::npos) << timed.out;
  EXPECT_EQ(read_text(dir / "b/latest_checkpointed_iteration.txt"), "1\n");
}

TEST(MegatronFlags, FinetuneTakesOnlyTheWeights) {
  TempDir dir;
  ASSERT_EQ(run_megatune(tiny({"--train-iters", "6", "--save", dir / "base"}), 120).exit_code, 0);
  const CliResult tuned = run_megatune(
      tiny({"--train-iters", "2", "--load", dir / "base", "--finetune", "--save", dir / "tuned"}), 120);
  ASSERT_EQ(tuned.exit_code, 0) << tuned.err;
  EXPECT_NE(tuned.out.find("for fine-tuning (--finetune)"), std::string::npos) << tuned.out;
  EXPECT_NE(tuned.out.find("iteration        2/       2 | consumed samples:            8"), std::string::npos)
      << tuned.out;
  EXPECT_EQ(read_text(dir / "tuned/latest_checkpointed_iteration.txt"), "2\n");
  // Fine-tuning into the directory it loads from would add a new run's iterations to the old run's.
  const CliResult same = run_megatune(
      tiny({"--train-iters", "2", "--load", dir / "base", "--finetune", "--save", dir / "base"}), 120);
  EXPECT_EQ(same.exit_code, 1) << same.out;
  EXPECT_NE(same.err.find("another run"), std::string::npos) << same.err;
  EXPECT_EQ(read_text(dir / "base/latest_checkpointed_iteration.txt"), "6\n");
  // --no-load-optim resumes the iteration with fresh moments: its first loss matches the resumed run's (the
  // same weights and data), its gradient step differs.
  const CliResult resumed = run_megatune(tiny({"--train-iters", "8", "--load", dir / "base"}), 120);
  const CliResult fresh_moments =
      run_megatune(tiny({"--train-iters", "8", "--load", dir / "base", "--no-load-optim"}), 120);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  ASSERT_EQ(fresh_moments.exit_code, 0) << fresh_moments.err;
  EXPECT_NE(fresh_moments.out.find("the optimizer state starts anew (--no-load-optim)"), std::string::npos);
  EXPECT_EQ(loss_at(resumed.out, 7), loss_at(fresh_moments.out, 7));
  EXPECT_NE(loss_at(resumed.out, 8), loss_at(fresh_moments.out, 8));
  const CliResult no_load = run_megatune(tiny({"--train-iters", "2", "--finetune"}), 60);
  EXPECT_EQ(no_load.error_lines(), 1) << no_load.err;
  EXPECT_NE(no_load.err.find("--finetune needs --load DIR"), std::string::npos) << no_load.err;
}

TEST(MegatronFlags, NprocIsTheWorldSize) {
  // Megatron derives the data-parallel size from the launcher's world size.
  const CliResult dp = run_megatune(tiny({"--train-iters", "1", "--nproc", "4", "--tp", "2"}), 120);
  ASSERT_EQ(dp.exit_code, 0) << dp.err;
  EXPECT_NE(dp.out.find("tp2 pp1 dp2"), std::string::npos) << dp.out;
  const CliResult moe =
      run_megatune(Flags{"train", "--model", "tiny-mixtral", "--device", "cpu", "--mock-data",
                         "--train-iters", "1", "--nproc", "2", "--ep", "2", "--dry-run"},
                   120);
  EXPECT_EQ(moe.exit_code, 0) << moe.err;
}

TEST(MegatronFlags, RecomputeActivationsAndModules) {
  const CliResult r = run_megatune(tiny({"--train-iters", "1", "--recompute-activations"}), 60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("recompute selective"), std::string::npos) << r.out;
  const CliResult modules = run_megatune(tiny({"--train-iters", "1", "--recompute-granularity", "selective",
                                               "--recompute-modules", "core_attn"}),
                                         60);
  EXPECT_EQ(modules.exit_code, 0) << modules.err;
  for (const auto& [flags, says] : std::vector<std::pair<Flags, std::string>>{
           {{"--recompute-activations", "--recompute-granularity", "full"}, "drop one of it and"},
           {{"--recompute-granularity", "selective", "--recompute-modules", "mlp"},
            "--recompute-modules mlp:"},
           {{"--recompute-modules", "core_attn"},
            "--recompute-modules applies to selective recomputation"}}) {
    const CliResult bad = run_megatune(tiny(Flags{"--train-iters", "1"} + flags), 60);
    EXPECT_EQ(bad.exit_code, 1);
    EXPECT_EQ(bad.error_lines(), 1) << bad.err;
    EXPECT_NE(bad.err.find(says), std::string::npos) << bad.err;
  }
}

TEST(MegatronFlags, NullTokenizerAndPerTokenLoss) {
  const CliResult r = run_megatune(
      tiny({"--train-iters", "1", "--tokenizer-type", "NullTokenizer", "--vocab-size", "300", "--dry-run"}),
      60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("vocab 301 (multiple 128)"), std::string::npos) << r.out;  // ids below 300, EOD 300
  const CliResult needs = run_megatune(tiny({"--train-iters", "1", "--tokenizer-type", "NullTokenizer"}), 60);
  EXPECT_EQ(needs.error_lines(), 1) << needs.err;
  EXPECT_NE(needs.err.find("NullTokenizer needs --vocab-size"), std::string::npos) << needs.err;
  const CliResult masked =
      run_megatune(tiny({"--train-iters", "1", "--calculate-per-token-loss", "--eod-mask-loss"}), 60);
  EXPECT_EQ(masked.error_lines(), 1) << masked.err;
  EXPECT_NE(masked.err.find("--calculate-per-token-loss with --eod-mask-loss"), std::string::npos)
      << masked.err;
}

TEST(MegatronFlags, TensorboardScalarsReadBack) {
  TempDir dir;
  const CliResult r = run_megatune(Flags{"train",
                                         "--model",
                                         "tiny-mixtral",
                                         "--device",
                                         "cpu",
                                         "--mock-data",
                                         "--gbs",
                                         "4",
                                         "--mbs",
                                         "2",
                                         "--log-interval",
                                         "2",
                                         "--train-iters",
                                         "4",
                                         "--moe-aux-loss-coeff",
                                         "1e-2",
                                         "--eval-interval",
                                         "2",
                                         "--eval-iters",
                                         "1",
                                         "--nproc",
                                         "2",
                                         "--tensorboard-dir",
                                         dir / "tb"},
                                   120);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir / "tb"))
    files.push_back(entry.path().string());
  ASSERT_EQ(files.size(), 1u);  // one writer: the last rank's
  EXPECT_NE(files.front().find("events.out.tfevents."), std::string::npos);
  std::string version;
  const std::vector<executor::ScalarEvent> events = executor::read_scalar_events(files.front(), &version);
  EXPECT_EQ(version, "brain.Event:2");
  const auto values = [&](const std::string& tag) {
    std::vector<std::pair<std::int64_t, float>> out;
    for (const auto& e : events)
      if (e.tag == tag) out.emplace_back(e.step, e.value);
    return out;
  };
  ASSERT_EQ(values("lm loss").size(), 4u);
  EXPECT_EQ(values("lm loss vs samples").back().first, 16);
  EXPECT_EQ(values("learning-rate").size(), 4u);
  EXPECT_EQ(values("grad-norm").size(), 4u);
  EXPECT_EQ(values("load_balancing_loss").size(), 4u);
  EXPECT_EQ(values("throughput").size(), 2u);  // at the log interval
  EXPECT_EQ(values("batch-size").front().second, 4.0f);
  EXPECT_EQ(values("world-size").front().second, 2.0f);
  // Validation at 2 and 4, then on the whole split after training.
  const auto validation = values("lm loss validation");
  ASSERT_EQ(validation.size(), 3u);
  EXPECT_EQ(validation.front().first, 2);
  // Each iteration's own loss (as Megatron's writer), whose mean over iterations 3 and 4 is the interval's
  // the log line shows, to its printed precision.
  const std::size_t at = r.out.find("iteration        4/");
  ASSERT_NE(at, std::string::npos);
  const double logged = std::stod(r.out.substr(r.out.find("lm loss: ", at) + 9));
  const auto loss = values("lm loss");
  EXPECT_NEAR((loss[2].second + loss[3].second) / 2.0, logged, 1e-5 * logged + 1e-6);
  // A directory that cannot be written: one line.
  write_text(dir / "file", "x");
  const CliResult bad = run_megatune(tiny({"--train-iters", "1", "--tensorboard-dir", dir / "file/tb"}), 60);
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_EQ(bad.error_lines(), 1) << bad.err;
  EXPECT_NE(bad.err.find("--tensorboard-dir"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace megatune::tests
