// Hugging Face interchange: HF folders the tests write (tiny GPT-2, tiny Llama with GQA, tiny Qwen3) go to
// megatune checkpoints (one shard, or a tp2 pp2 layout's shards) and back bit-exactly in fp32; a checkpoint
// trained under tp2 pp2 on CPU threads exported to HF and imported at tp1 holds the same fp32 parameters and
// gives the same validation loss.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "base/user_error.h"
#include "executor/checkpoint/hf_model.h"
#include "executor/checkpoint/safetensors_folder.h"
#include "executor/training/hf_conversion.h"
#include "executor/training/thread_run.h"
#include "layouts/model_flags.h"
#include "tests/executor/parallel_test_models.h"

namespace megatune::executor {
namespace {

namespace fs = std::filesystem;
using checkpoint::HfModel;

layouts::ParallelConfig layout(const layouts::ModelSpec& m, int tp, int pp, bool sp = false) {
  layouts::ParallelConfig c;
  c.tensor_model_parallel_size = tp;
  c.pipeline_model_parallel_size = pp;
  c.world_size = tp * pp;
  c.sequence_parallel = sp;
  c.micro_batch_size = 2;
  c.global_batch_size = 8;
  c.validate(m);
  return c;
}

// Writes an HF folder of `model` with random fp32 tensors (sharded: small files and an index); returns
// each tensor's bytes.
std::map<std::string, std::vector<uint8_t>> write_random_hf(const std::string& directory,
                                                            const HfModel& model) {
  fs::create_directories(directory);
  std::mt19937 random(7);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::map<std::string, std::vector<uint8_t>> bytes;
  std::vector<checkpoint::SafetensorsTensor> tensors;
  for (const checkpoint::HfBinding& binding : checkpoint::hf_bindings(model))
    for (const checkpoint::HfPiece& piece : binding.pieces) {
      int64_t n = 1;
      for (int64_t d : piece.shape) n *= d;
      std::vector<float> values(static_cast<size_t>(n));
      for (float& v : values) v = normal(random);
      bytes[piece.name] = checkpoint::encode_floats(values, checkpoint::TensorDType::fp32);
      tensors.push_back({piece.name, checkpoint::TensorDType::fp32, piece.shape, bytes[piece.name]});
    }
  checkpoint::write_safetensors_folder(directory, tensors, 40'000, {{"format", "pt"}});
  std::ofstream(fs::path(directory) / "config.json") << checkpoint::hf_config_text(model, "float32");
  return bytes;
}

TrainOptions options(std::int64_t iters) {
  TrainOptions o;
  o.lr = 3e-3;
  o.train_iters = iters;
  o.mock_data = true;
  o.log_interval = 1;
  return o;
}

// The final validation loss a run logs.
double final_validation_loss(const std::string& log) {
  const std::string key = "on validation set | lm loss value: ";
  const size_t at = log.find(key);
  if (at == std::string::npos) {
    ADD_FAILURE() << "no final validation line in:\n" << log;
    return 0;
  }
  return std::stod(log.substr(at + key.size()));
}

class HfConversion : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("megatune_hf_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // HF -> megatune (under `parallel`, or one shard) -> HF: every tensor's bytes and the config survive.
  void expect_round_trip(const layouts::ModelSpec& spec, const layouts::ModelNumerics& numerics,
                         const layouts::ParallelConfig* parallel) {
    const HfModel written = checkpoint::hf_model_of(spec, numerics);
    const auto original = write_random_hf(path("hf"), written);
    const HfModel read = checkpoint::read_hf_config(path("hf"), spec.make_vocab_size_divisible_by);
    EXPECT_EQ(layouts::model_flags(read.spec, read.numerics), layouts::model_flags(spec, written.numerics));
    const int tp = parallel ? parallel->tp() : 1;
    const FullParameters imported = read_hf_parameters(path("hf"), read, read.spec.padded_vocab_size(tp));
    write_converted_checkpoint(path("ckpt"), read, imported, parallel, "test");
    EXPECT_EQ(checkpoint_model_args(path("ckpt")), layouts::model_flags(read.spec, read.numerics));
    int64_t padded = 0;
    const FullParameters exported =
        read_checkpoint_parameters(path("ckpt"), read.spec, read.numerics, &padded);
    EXPECT_EQ(padded, read.spec.padded_vocab_size(tp));
    EXPECT_EQ(exported, imported);
    write_hf_folder(path("out"), checkpoint::hf_model_of(read.spec, read.numerics), exported,
                    checkpoint::TensorDType::fp32, 50'000);
    const checkpoint::SafetensorsFolder out(path("out"));
    EXPECT_EQ(out.tensor_names().size(), original.size());
    for (const auto& [name, bytes] : original) {
      const std::vector<float> values = out.read_floats(name);
      EXPECT_EQ(checkpoint::encode_floats(values, checkpoint::TensorDType::fp32), bytes) << name;
    }
    const HfModel back = checkpoint::read_hf_config(path("out"), spec.make_vocab_size_divisible_by);
    EXPECT_EQ(layouts::model_flags(back.spec, back.numerics), layouts::model_flags(read.spec, read.numerics));
    EXPECT_TRUE(fs::exists(path("out/model.safetensors.index.json")));
  }
  fs::path dir_;
};

layouts::ModelSpec with_vocab(layouts::ModelSpec m, int vocab) {
  m.vocab_size = vocab;
  return m;
}

TEST_F(HfConversion, Gpt2RoundTripsBitExactly) {
  expect_round_trip(with_vocab(test::gpt_tiny(/*tied=*/true), 300), {10000.0, 1e-6},
                    nullptr);  // padded to 384, trimmed back
}

TEST_F(HfConversion, LlamaWithGroupedQueryAttentionRoundTripsBitExactly) {
  const layouts::ModelSpec spec = with_vocab(test::llama_tiny(/*tied=*/false), 300);
  ASSERT_EQ(spec.query_groups(), 2);
  expect_round_trip(spec, {500000.0, 1e-6}, nullptr);
}

TEST_F(HfConversion, MixtralRoundTripsBitExactly) {
  layouts::ModelSpec spec = with_vocab(layouts::model_preset("tiny-mixtral"), 300);
  spec.ffn_hidden_size = spec.moe_ffn_size();  // HF's intermediate_size is the experts'
  expect_round_trip(spec, {1e6, 1e-5}, nullptr);
}

// Qwen3: Llama's layers with q_norm / k_norm (--qk-layernorm), through the shards of a tp2 layout (the head
// norms are replicated over TP).
TEST_F(HfConversion, Qwen3RoundTripsBitExactlyThroughTp2Shards) {
  layouts::ModelSpec spec = with_vocab(test::llama_tiny(/*tied=*/false), 300);
  spec.qk_layernorm = true;
  const layouts::ParallelConfig parallel = layout(spec, 2, 1);
  expect_round_trip(spec, {1e6, 1e-6}, &parallel);
  std::ifstream in(path("out/config.json"));
  const std::string config((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(config.find("\"model_type\": \"qwen3\""), std::string::npos) << config;
  EXPECT_NE(config.find("Qwen3ForCausalLM"), std::string::npos) << config;
  const checkpoint::SafetensorsFolder out(path("out"));
  EXPECT_EQ(out.read_floats("model.layers.3.self_attn.k_norm.weight").size(),
            static_cast<size_t>(spec.head_dim()));
  EXPECT_EQ(out.read_floats("model.layers.0.self_attn.q_norm.weight").size(),
            static_cast<size_t>(spec.head_dim()));
}

TEST_F(HfConversion, RoundTripsThroughTheShardsOfATp2Pp2Layout) {
  layouts::ModelSpec spec = with_vocab(test::llama_tiny(/*tied=*/true), 300);
  spec.make_vocab_size_divisible_by = 256;  // 512 rows at tp1 and tp2 alike: the same softmax
  const layouts::ParallelConfig parallel = layout(spec, 2, 2, /*sp=*/true);
  expect_round_trip(spec, {500000.0, 1e-6}, &parallel);
  EXPECT_TRUE(fs::exists(path("ckpt/iter_0000000/rank_00003/manifest.txt")));
  // The shards load rank by rank under their layout (no resharding) and give the validation loss the
  // one-shard import gives at tp1.
  TrainOptions own = options(1);
  own.load = path("ckpt");
  own.lr = 0.0;
  own.eval_iters = 1;
  std::ostringstream own_log;
  train_on_threads(spec, parallel, own, own_log);
  EXPECT_EQ(own_log.str().find("resharded"), std::string::npos) << own_log.str();
  const HfModel read = checkpoint::read_hf_config(path("hf"), 256);
  write_converted_checkpoint(path("single"), read, read_hf_parameters(path("hf"), read, 512), nullptr,
                             "test");
  TrainOptions single = own;
  single.load = path("single");
  std::ostringstream single_log;
  train_on_threads(spec, layout(spec, 1, 1), single, single_log);
  const double loss = final_validation_loss(single_log.str());
  EXPECT_NEAR(final_validation_loss(own_log.str()), loss, 2e-5 * loss);
}

TEST_F(HfConversion, RefusesAConfigAndWeightsOfDifferentModels) {
  const layouts::ModelSpec spec = test::llama_tiny(false);
  write_random_hf(path("hf"), checkpoint::hf_model_of(spec, {}));
  layouts::ModelSpec wider = spec;
  wider.ffn_hidden_size = 2 * spec.ffn_size();
  std::ofstream(path("hf/config.json"))
      << checkpoint::hf_config_text(checkpoint::hf_model_of(wider, {}), "float32");
  const HfModel read = checkpoint::read_hf_config(path("hf"), 128);
  try {
    read_hf_parameters(path("hf"), read, read.spec.padded_vocab_size(1));
    ADD_FAILURE() << "read";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("gate_proj"), std::string::npos) << e.what();
  }
  std::ofstream(path("hf/config.json")) << R"({"model_type": "llama", "hidden_size": 64})";
  EXPECT_THROW(checkpoint::read_hf_config(path("hf"), 128), UserError);
  std::ofstream(path("hf/config.json")) << R"({"model_type": "bert"})";
  EXPECT_THROW(checkpoint::read_hf_config(path("hf"), 128), UserError);
}

TEST_F(HfConversion, TakesTransformersDefaultsForFieldsAConfigLeavesOut) {
  fs::create_directories(path("hf"));
  std::ofstream(path("hf/config.json"))
      << R"({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "intermediate_size": 128, "max_position_embeddings": 8192, "vocab_size": 300})";
  const HfModel llama = checkpoint::read_hf_config(path("hf"), 128);
  EXPECT_TRUE(llama.spec.untie_embeddings_and_output_weights);  // LlamaConfig's default
  EXPECT_EQ(llama.spec.query_groups(), 4);
  EXPECT_EQ(llama.spec.seq_length, 4096);
  EXPECT_EQ(llama.numerics.norm_epsilon, 1e-6);
  EXPECT_EQ(llama.numerics.rotary_base, 10000.0);
  std::ofstream(path("hf/config.json")) << R"({"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4,
      "n_positions": 1024, "vocab_size": 300})";
  const HfModel gpt2 = checkpoint::read_hf_config(path("hf"), 128);
  EXPECT_FALSE(gpt2.spec.untie_embeddings_and_output_weights);
  EXPECT_EQ(gpt2.spec.ffn_size(), 256);
  EXPECT_EQ(gpt2.spec.seq_length, 1024);
  std::ofstream(path("hf/config.json"))
      << R"({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "intermediate_size": 128, "max_position_embeddings": 8192, "vocab_size": 300,
      "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})";
  EXPECT_THROW(checkpoint::read_hf_config(path("hf"), 128), UserError);
  // Qwen3 (its head_dim apart from hidden / heads, as Qwen3's configs have): the head norms; a sliding
  // window is refused.
  const std::string qwen3 = R"({"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 128,
      "max_position_embeddings": 8192, "vocab_size": 300, "rope_theta": 1000000, "tie_word_embeddings": true)";
  std::ofstream(path("hf/config.json")) << qwen3 << R"(, "use_sliding_window": false})";
  const HfModel q = checkpoint::read_hf_config(path("hf"), 128);
  EXPECT_TRUE(q.spec.qk_layernorm);
  EXPECT_EQ(q.spec.head_dim(), 32);
  EXPECT_EQ(q.spec.query_groups(), 2);
  EXPECT_FALSE(q.spec.untie_embeddings_and_output_weights);
  EXPECT_EQ(q.architecture, checkpoint::HfArchitecture::kQwen3);
  std::ofstream(path("hf/config.json")) << qwen3 << R"(, "use_sliding_window": true})";
  EXPECT_THROW(checkpoint::read_hf_config(path("hf"), 128), UserError);
}

// A checkpoint trained 3 iterations under tp2 pp2 (sequence parallel) on CPU threads, exported to HF and
// imported at tp1: the same fp32 parameters, and the same validation loss as the original resumed at tp1.
TEST_F(HfConversion, TrainedTp2Pp2CheckpointSurvivesHfAtTp1) {
  const layouts::ModelSpec spec = test::llama_tiny(/*tied=*/false);
  const layouts::ParallelConfig parallel = layout(spec, 2, 2, /*sp=*/true);
  TrainOptions first = options(3);
  first.save = path("trained");
  std::ostringstream quiet;
  train_on_threads(spec, parallel, first, quiet);
  const layouts::ModelNumerics numerics{first.rotary_base, first.norm_epsilon};
  int64_t padded = 0;
  const FullParameters trained = read_checkpoint_parameters(path("trained"), spec, numerics, &padded);
  write_hf_folder(path("hf"), checkpoint::hf_model_of(spec, numerics), trained, checkpoint::TensorDType::fp32,
                  5'000'000'000);
  const HfModel read = checkpoint::read_hf_config(path("hf"), 128);
  write_converted_checkpoint(path("converted"), read,
                             read_hf_parameters(path("hf"), read, read.spec.padded_vocab_size(1)), nullptr,
                             path("hf"));
  int64_t converted_padded = 0;
  const FullParameters converted =
      read_checkpoint_parameters(path("converted"), read.spec, read.numerics, &converted_padded);
  ASSERT_EQ(converted_padded, padded);  // 256: no padding at tp1 or tp2
  EXPECT_EQ(converted, trained);

  const layouts::ParallelConfig single = layout(spec, 1, 1);
  TrainOptions resumed = options(3);  // the original at tp1 (resharded): no step, then the validation
  resumed.load = path("trained");
  resumed.eval_iters = 1;
  std::ostringstream resumed_log;
  train_on_threads(spec, single, resumed, resumed_log);
  TrainOptions imported = options(1);  // iteration 0: one step at lr 0 leaves the parameters as they are
  imported.load = path("converted");
  imported.lr = 0.0;
  imported.eval_iters = 1;
  std::ostringstream imported_log;
  train_on_threads(read.spec, single, imported, imported_log);
  const double original_loss = final_validation_loss(resumed_log.str());
  EXPECT_GT(original_loss, 0.0);
  EXPECT_EQ(final_validation_loss(imported_log.str()), original_loss);
}

}  // namespace
}  // namespace megatune::executor
