// bench_train_gpu: the executor on one GPU.
//   perf   --model NAME --mbs B --seq S [--iters N] [--recompute none|selective|full] [--loss-chunk-mib M]
//          [--fp8 e4m3|hybrid [--fp8-recipe delayed|tensorwise]]
//          [--no-gelu-epilogue]
//          step time (median), MFU (Megatron FLOPs / 989.4 TFLOP/s), device memory, per-kernel time shares
//          and attention TFLOP/s, on the shapes of bench/peer/torch_gpt.py (layouts::torch_anchor_model),
//          or of a megatune preset (mixtral-small: bench/peer/torch_moe.py's MoE shape).
//   memory --model NAME --mbs B --seq S [--recompute ...] [--loss-chunk-mib M]
//          the arena breakdown (weights, optimizer state, saved activations, shared buffers, logits) from
//          sizing alone: needs no GPU.
//   parity --out DIR [--llama]
//          writes a small model's weights, one batch, and megatune's loss and gradients (CUDA backend) for
//          bench/peer/parity.py to recompute in PyTorch from the same weights.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "executor/backend/sizing_backend.h"
#include "executor/cuda/cuda_backend.h"
#include "executor/kernels/reference_elementwise.h"
#include "executor/parallel/communicator.h"
#include "executor/training/trainer.h"
#include "layouts/flops.h"
#include "layouts/fp8.h"
#include "layouts/model_spec.h"

using namespace megatune;
using namespace megatune::executor;

namespace {

std::string arg(int argc, char** argv, const char* name, const std::string& fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return fallback;
}
bool flag(int argc, char** argv, const char* name) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return true;
  return false;
}

std::vector<MicroBatch> random_batches(const TrainerConfig& c, std::int64_t vocab, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<MicroBatch> out(c.batch.num_microbatches);
  for (MicroBatch& mb : out)
    for (std::int64_t t = 0; t < c.batch.micro_batch * c.batch.seq; ++t) {
      mb.tokens.push_back(static_cast<std::int32_t>(rng() % vocab));
      mb.labels.push_back(static_cast<std::int32_t>(rng() % vocab));
      mb.loss_mask.push_back(1.0f);
    }
  return out;
}

// The dense peer's shapes (torch_gpt.py CONFIGS) by their names; any other name is a megatune preset
// (mixtral-small: the MoE peer's shape, torch_moe.py).
layouts::ModelSpec bench_model(const std::string& name) {
  const std::vector<std::string> anchors = layouts::torch_anchor_model_names();
  if (std::find(anchors.begin(), anchors.end(), name) != anchors.end())
    return layouts::torch_anchor_model(name);
  return layouts::model_preset(name);
}

TrainerConfig perf_config(int argc, char** argv, layouts::ModelSpec& spec) {
  spec = bench_model(arg(argc, argv, "--model", "gpt-1.3b"));
  const int mbs = std::stoi(arg(argc, argv, "--mbs", "4"));
  const int seq = std::stoi(arg(argc, argv, "--seq", std::to_string(spec.seq_length)));
  spec.seq_length = seq;
  // --num-layers: a preset cut to fewer layers (e.g. llama3-8b at 16 layers on one GPU).
  spec.num_layers = std::stoi(arg(argc, argv, "--num-layers", std::to_string(spec.num_layers)));
  spec.max_position_embeddings = std::max(spec.max_position_embeddings, seq);
  TrainerConfig config;
  config.model = transformer_config_from(spec, 1, 10000.0f, 1e-5f, 0.02f);
  if (config.model.is_moe())
    config.model.router.aux_loss_coeff = 1e-2;  // softmax top-k with aux loss, as the peer
  config.batch.micro_batch = mbs;
  config.batch.seq = seq;
  config.batch.num_microbatches = 1;
  // --loss-chunk-mib: bf16 logits held per LM-head chunk (default 256; larger = fewer, larger head GEMMs).
  config.batch.loss_chunk_logits_bytes =
      std::stoll(arg(argc, argv, "--loss-chunk-mib", std::to_string(layouts::kLossChunkLogitsBytes >> 20)))
      << 20;
  config.recompute = layouts::parse_recompute_granularity(arg(argc, argv, "--recompute", "none"));
  // --fp8 e4m3|hybrid [--fp8-recipe delayed|tensorwise]: the dense linears' GEMMs in FP8.
  const std::string fp8 = arg(argc, argv, "--fp8", "none");
  if (fp8 != "none") {
    config.model.fp8.format = fp8 == "hybrid" ? layouts::Fp8Format::kHybrid : layouts::Fp8Format::kE4M3;
    config.model.fp8.recipe = arg(argc, argv, "--fp8-recipe", "delayed") == "tensorwise"
                                  ? layouts::Fp8Recipe::kTensorwise
                                  : layouts::Fp8Recipe::kDelayed;
  }
  config.lr.max_lr = 1e-4;
  config.lr.style = LrDecayStyle::kConstant;
  return config;
}

// The GPU's idle time between consecutive ops of the timed iteration (host work, waits), and the largest
// gaps with the op that waited.
void print_idle_gaps(const std::vector<Backend::TimedOp>& timed) {
  std::vector<std::pair<double, std::string>> gaps;
  double idle_ms = 0;
  for (std::size_t i = 1; i < timed.size(); ++i) {
    const double gap = timed[i].start_ms - (timed[i - 1].start_ms + timed[i - 1].ms);
    if (gap <= 0) continue;
    idle_ms += gap;
    gaps.emplace_back(gap, timed[i - 1].op.label + " -> " + timed[i].op.label + " (layer " +
                               std::to_string(timed[i].op.layer) + ")");
  }
  std::sort(gaps.rbegin(), gaps.rend());
  std::printf("  idle between ops: %.2f ms; largest:", idle_ms);
  for (std::size_t i = 0; i < std::min<std::size_t>(6, gaps.size()); ++i)
    std::printf(" %.2f %s;", gaps[i].first, gaps[i].second.c_str());
  std::printf("\n");
}

int memory(int argc, char** argv) {
  layouts::ModelSpec spec;
  const TrainerConfig config = perf_config(argc, argv, spec);
  SizingBackend sizing;
  const std::vector<ArenaUse> breakdown = size_training_arena(config, sizing);
  std::printf(
      "MEGATUNE arena model=%s seq=%lld mbs=%lld recompute=%s (kernel scratch and the GEMM / grad-norm "
      "workspaces not included)\n%s",
      spec.name.c_str(), static_cast<long long>(config.batch.seq),
      static_cast<long long>(config.batch.micro_batch), arg(argc, argv, "--recompute", "none").c_str(),
      format_arena_breakdown(breakdown).c_str());
  return 0;
}

int perf(int argc, char** argv) {
  layouts::ModelSpec spec;
  const TrainerConfig config = perf_config(argc, argv, spec);
  const std::string name = arg(argc, argv, "--model", "gpt-1.3b");
  const int mbs = static_cast<int>(config.batch.micro_batch), seq = static_cast<int>(config.batch.seq);
  const int iters = std::stoi(arg(argc, argv, "--iters", "10"));
  CudaBackend gpu(0);
  if (flag(argc, argv, "--no-gelu-epilogue")) {  // GEMM + bias, then a separate GELU pass
    CudaBackend::GemmEpilogues epilogues = gpu.gemm_epilogues();
    epilogues.gelu_forward = false;
    gpu.set_gemm_epilogues(epilogues);
  }
  SingleRankCommunicator comm(gpu);
  Trainer trainer(config, single_stage_schedule(spec.num_layers, 1), gpu, comm);
  const std::vector<ArenaUse> arena = gpu.arena_breakdown();
  const std::vector<MicroBatch> data = random_batches(config, spec.vocab_size, 1);
  for (int i = 0; i < 3; ++i) trainer.train_step(data);  // warm-up: GEMM plans, first-touch
  std::vector<double> times;
  double loss = 0;
  for (int i = 0; i < iters; ++i) {
    const StepResult r = trainer.train_step(data);
    times.push_back(r.elapsed_s);
    loss = r.loss;
  }
  std::string in_order;  // drift (plans, clocks) shows in the order the steps ran
  for (double t : times)
    in_order += " " + std::to_string(static_cast<int>(t * 1e4 + 0.5) / 10.0).substr(0, 5);
  std::sort(times.begin(), times.end());
  const double step_s = times[times.size() / 2];
  const double flops = layouts::model_flops_per_iteration(spec, mbs, 1);
  const double mfu = flops / (step_s * 989.4e12) * 100.0;
  // Host round trips of the MoE layers in one step: plan uploads (H2D, no wait) and the waits for the
  // router logits (forward) and the probability gradients (backward).
  const CudaBackend::MoeTransfers before = gpu.moe_transfers();
  trainer.train_step(data);
  const CudaBackend::MoeTransfers after = gpu.moe_transfers();
  // Per-kernel shares from one timed iteration.
  gpu.set_op_timing(true);
  trainer.train_step(data);
  gpu.set_op_timing(false);
  const std::vector<Backend::TimedOp> timed = gpu.timed_ops();
  std::map<std::string, double> by_kind;
  std::map<std::string, std::pair<double, double>> by_gemm;  // label -> (ms, flops)
  double total_ms = 0, attn_fwd_ms = 0, attn_bwd_ms = 0, attn_fwd_flops = 0, attn_bwd_flops = 0, gemm_ms = 0,
         gemm_flops = 0;
  for (const Backend::TimedOp& t : timed) {
    std::string key = layouts::op_kind_name(t.op.kind);
    if (t.op.kind == layouts::OpKind::kGemm) {
      const std::string& l = t.op.label;
      key = "gemm " + l.substr(0, l.find('_'));
      gemm_ms += t.ms;
      gemm_flops += t.op.gemm_flops();
      by_gemm[l].first += t.ms;
      by_gemm[l].second += t.op.gemm_flops();
    }
    by_kind[key] += t.ms;
    total_ms += t.ms;
    if (t.op.kind == layouts::OpKind::kAttentionForward) {
      attn_fwd_ms += t.ms;
      attn_fwd_flops += t.op.attention_flops();
    } else if (t.op.kind == layouts::OpKind::kAttentionBackward) {
      attn_bwd_ms += t.ms;
      attn_bwd_flops += t.op.attention_flops();
    }
  }
  std::printf(
      "MEGATUNE model=%s seq=%d mbs=%d recompute=%s precision=%s step=%.1fms MFU=%.1f%% TFLOP/s=%.1f "
      "mem=%.2fGiB loss=%.3f\n",
      name.c_str(), seq, mbs, arg(argc, argv, "--recompute", "none").c_str(),
      layouts::describe(config.model.fp8).c_str(), step_s * 1e3, mfu, flops / step_s / 1e12,
      gpu.device_bytes() / double(1 << 30), loss);
  std::printf("  kernels: %.1f ms of %.1f ms step (timed iteration, events around each op)\n", total_ms,
              step_s * 1e3);
  std::printf("  step times in order (ms):%s\n", in_order.c_str());
  print_idle_gaps(timed);
  if (spec.is_moe())
    std::printf(
        "  MoE host round trips per step: %lld plan uploads, %lld d_probs waits, %d router-logit waits\n",
        static_cast<long long>(after.plan_uploads - before.plan_uploads),
        static_cast<long long>(after.d_probs_downloads - before.d_probs_downloads), spec.num_moe_layers());
  std::vector<std::pair<double, std::string>> shares;
  for (auto& [k, ms] : by_kind) shares.emplace_back(ms, k);
  std::sort(shares.rbegin(), shares.rend());
  for (auto& [ms, k] : shares)
    std::printf("  %-22s %8.2f ms %5.1f%%\n", k.c_str(), ms, 100.0 * ms / total_ms);
  std::printf("  GEMMs by pass (ms, TFLOP/s):");
  for (auto& [label, v] : by_gemm)
    std::printf(" %s %.2f/%.0f", label.c_str(), v.first, v.second / v.first / 1e9);
  std::printf("\n");
  std::printf("  fused GEMM epilogues (fused/unfused calls): GELU_AUX_BIAS %lld/%lld, BGRADB %lld/%lld\n",
              static_cast<long long>(gpu.gelu_forward_use().fused),
              static_cast<long long>(gpu.gelu_forward_use().unfused),
              static_cast<long long>(gpu.wgrad_bias_use().fused),
              static_cast<long long>(gpu.wgrad_bias_use().unfused));
  std::printf("  device memory: arena (below) + %.3f GiB of GEMM / grad-norm workspaces\n%s",
              double(gpu.device_bytes() - gpu.arena_capacity_bytes()) / double(1 << 30),
              format_arena_breakdown(arena).c_str());
  std::printf("  GEMMs: %.0f TFLOP/s; attention fwd %.0f TFLOP/s, bwd %.0f TFLOP/s (causal FLOPs halved)\n",
              gemm_flops / gemm_ms / 1e9, attn_fwd_ms > 0 ? attn_fwd_flops / attn_fwd_ms / 1e9 : 0.0,
              attn_bwd_ms > 0 ? attn_bwd_flops / attn_bwd_ms / 1e9 : 0.0);
  return 0;
}

void write_floats(const std::string& path, const std::vector<float>& v) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  if (!out) throw std::runtime_error("cannot write " + path);
}

int parity(int argc, char** argv) {
  const std::string dir = arg(argc, argv, "--out", "parity");
  const bool llama = flag(argc, argv, "--llama");
  TrainerConfig config;
  TransformerConfig& m = config.model;
  m.num_layers = 2;
  m.hidden = 256;
  m.heads = 4;
  m.kv_heads = llama ? 2 : 4;
  m.head_dim = 64;
  m.ffn_hidden = 512;
  m.vocab_size = 1024;
  m.max_seq = 256;
  m.tied_embeddings = false;
  m.init_std = 0.05f;
  if (llama) {
    m.norm = NormKind::kRMSNorm;
    m.activation = ActivationKind::kSwiglu;
    m.position = PositionEmbedding::kRope;
    m.bias = false;
  }
  config.batch.micro_batch = 2;
  config.batch.seq = 256;
  config.batch.num_microbatches = 1;
  CudaBackend gpu(0);
  SingleRankCommunicator comm(gpu);
  Trainer trainer(config, single_stage_schedule(m.num_layers, 1), gpu, comm);
  GPTModel& model = trainer.model();
  // Weights rounded to bf16 as the model's GEMMs see them, so PyTorch starts from the same values (the untied
  // embedding lookup reads the fp32 main parameters, which are bf16-exact after this round trip).
  std::vector<float> weights = model.main_parameters();
  reference::round_to_bf16_inplace(weights.data(), static_cast<std::int64_t>(weights.size()));
  model.set_main_parameters(weights);
  const std::vector<MicroBatch> data = random_batches(config, m.vocab_size, 5);
  model.zero_gradients();
  model.forward(data[0], 0);
  model.backward(0);
  const double loss = model.microbatch_losses()[0];
  std::ofstream index(dir + "/index.txt");
  index << "config " << (llama ? "llama" : "gpt") << " layers " << m.num_layers << " hidden " << m.hidden
        << " heads " << m.heads << " kv_heads " << m.kv_heads << " ffn " << m.ffn_hidden << " vocab "
        << m.vocab_size << " seq " << config.batch.seq << " mbs " << config.batch.micro_batch << " eps "
        << m.norm_eps << "\n";
  index << "loss " << loss << "\n";
  for (const ParameterEntry& e : model.layout().entries())
    index << "param " << e.name << " " << e.rows << " " << e.cols << " " << e.offset << "\n";
  write_floats(dir + "/weights.bin", weights);
  write_floats(dir + "/grads.bin", model.gradients());
  std::ofstream tokens(dir + "/tokens.bin", std::ios::binary);
  tokens.write(reinterpret_cast<const char*>(data[0].tokens.data()), data[0].tokens.size() * 4);
  tokens.write(reinterpret_cast<const char*>(data[0].labels.data()), data[0].labels.size() * 4);
  std::printf("parity export (%s): loss %.6f -> %s\n", llama ? "llama" : "gpt", loss, dir.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "perf";
    if (mode == "parity") return parity(argc, argv);
    if (mode == "memory") return memory(argc, argv);
    return perf(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_train_gpu: %s\n", e.what());
    return 1;
  }
}
