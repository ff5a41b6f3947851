// `megatune data`: preprocess text/JSONL into Megatron indexed datasets, inspect a dataset, and print the
// samples GPTDataset draws (to compare with Megatron-LM).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <string>

#include "base/input_file.h"
#include "base/user_error.h"
#include "executor/data/byte_tokenizer.h"
#include "executor/data/dataset_builder.h"
#include "executor/data/indexed_dataset.h"
#include "executor/data/npy_file.h"
#include "executor/data/preprocess.h"
#include "tools/command_registry.h"
#include "tools/input_checks.h"
#include "tools/progress_bar.h"
#include "tools/tokenizer_flags.h"

namespace megatune::tools {
namespace {

using namespace megatune::executor::data;

struct PreprocessArgs {
  PreprocessConfig config;
  std::string text_document = "paragraph";
};

struct SampleArgs {
  std::vector<std::string> data_path;
  bool mock_data = false;
  std::string split = "969,30,1";
  int64_t seq_length = 0;
  int64_t num_samples = 0;
  uint32_t seed = 1234;
  int64_t vocab_size = ByteTokenizer::kVocabSize;
  int64_t first = 0;
  int64_t count = 1;
  bool text = false;
  std::string dump_indices;
};

int run_preprocess(PreprocessArgs& args) {
  args.config.text_document_mode = args.text_document == "line"   ? TextDocumentMode::line
                                   : args.text_document == "file" ? TextDocumentMode::file
                                                                  : TextDocumentMode::paragraph;
  std::string keys;
  for (const auto& key : args.config.json_keys) {
    if (!keys.empty()) keys.push_back(',');
    keys += key;
  }
  // Refused in one line, before the header line.
  check_json_keys(args.config.json_keys);
  require_regular_file(args.config.input_path, "--input");
  std::fprintf(stderr, "megatune data preprocess: %s -> %s_{%s}_document.bin/.idx (%s tokenizer)\n",
               args.config.input_path.c_str(), args.config.output_prefix.c_str(), keys.c_str(),
               args.config.tokenizer.type.c_str());
  // Input bytes read: redrawn on a terminal, one line per 10% when stderr is a file or a pipe.
  ProgressBar bar(std::cerr, "preprocess", 0, ::isatty(::fileno(stderr)) != 0, ProgressBar::Units::kBytes);
  const auto result = preprocess_data(args.config, [&](const PreprocessProgress& progress) {
    const double mb = static_cast<double>(progress.input_bytes_read) / 1e6;
    const double rate = progress.elapsed_s > 0 ? mb / progress.elapsed_s : 0.0;
    char detail[96];
    std::snprintf(detail, sizeof detail, "%lld docs, %lld tokens, %.1f MB/s",
                  static_cast<long long>(progress.documents), static_cast<long long>(progress.tokens), rate);
    bar.set_total(static_cast<std::size_t>(progress.input_bytes_total));
    bar.update(static_cast<std::size_t>(progress.input_bytes_read), detail);
  });
  bar.finish();
  for (const auto& output : result.outputs) {
    std::printf("%s.bin/.idx: %lld documents, %lld tokens, dtype %s\n", output.path_prefix.c_str(),
                static_cast<long long>(output.documents), static_cast<long long>(output.tokens),
                index_dtype_name(output.dtype).c_str());
  }
  if (result.skipped_empty_documents > 0) {
    std::printf("%lld empty documents were kept as documents without sequences (as Megatron does)\n",
                static_cast<long long>(result.skipped_empty_documents));
  }
  std::printf("done in %.2f s\n", result.elapsed_s);
  return 0;
}

int run_data_info(const std::string& prefix) {
  const IndexedDataset dataset(prefix);
  const auto& lengths = dataset.sequence_lengths();
  int64_t shortest = 0, longest = 0;
  if (!lengths.empty()) {
    shortest = *std::min_element(lengths.begin(), lengths.end());
    longest = *std::max_element(lengths.begin(), lengths.end());
  }
  const double mean =
      lengths.empty() ? 0.0 : static_cast<double>(dataset.num_tokens()) / static_cast<double>(lengths.size());
  std::printf("dataset     %s (.bin/.idx valid)\n", prefix.c_str());
  std::printf("dtype       %s\n", index_dtype_name(dataset.dtype()).c_str());
  std::printf("documents   %lld\n", static_cast<long long>(dataset.num_documents()));
  std::printf("sequences   %lld\n", static_cast<long long>(dataset.num_sequences()));
  std::printf("tokens      %lld\n", static_cast<long long>(dataset.num_tokens()));
  std::printf("seq length  min %lld  mean %.1f  max %lld\n", static_cast<long long>(shortest), mean,
              static_cast<long long>(longest));
  std::printf("idx bytes   %llu\n",
              static_cast<unsigned long long>(std::filesystem::file_size(index_file_path(prefix))));
  std::printf("bin bytes   %llu\n",
              static_cast<unsigned long long>(std::filesystem::file_size(data_file_path(prefix))));
  return 0;
}

int run_sample(const SampleArgs& args) {
  if (args.seq_length < 1) throw UserError("--seq-length is required and must be positive");
  DataConfig config;
  config.data_path = args.data_path;
  config.mock_data = args.mock_data;
  config.split = args.split;
  config.gpt.sequence_length = args.seq_length;
  config.gpt.random_seed = args.seed;
  config.gpt.vocab_size = args.vocab_size;
  config.gpt.eod_token = args.vocab_size > ByteTokenizer::kEodToken ? ByteTokenizer::kEodToken : 0;
  if (!args.mock_data && args.data_path.empty()) throw UserError("give --data-path PREFIX or --mock-data");
  const auto datasets =
      build_train_valid_test_datasets(config, {args.num_samples > 0 ? args.num_samples : -1, 0, 0});
  if (!datasets.train) throw UserError("--split " + args.split + " leaves no train split");
  const auto& train = *datasets.train;
  if (args.first >= train.num_samples()) {
    const std::string samples = std::to_string(train.num_samples());
    throw UserError("--first " + std::to_string(args.first) +
                    " is past the end of the train split, which has " + samples + " samples (" +
                    train.description() + "); give --first below " + samples);
  }
  if (!args.dump_indices.empty()) {
    const auto* gpt = dynamic_cast<const GPTDataset*>(&train);
    if (gpt == nullptr)
      throw UserError("--dump-indices needs a single --data-path (a blend has one set per dataset)");
    write_gpt_dataset_indices(args.dump_indices, gpt->indices());
    std::printf("wrote %s-{document,sample,shuffle}_index.npy (%lld epochs%s)\n", args.dump_indices.c_str(),
                static_cast<long long>(gpt->indices().num_epochs),
                gpt->indices().separate_final_epoch ? ", separate final epoch" : "");
  }
  std::printf("%s: %lld samples\n", train.description().c_str(), static_cast<long long>(train.num_samples()));
  std::vector<int32_t> tokens(static_cast<size_t>(args.seq_length)), labels(tokens.size());
  std::vector<float> mask(tokens.size());
  for (int64_t k = args.first; k < std::min(args.first + args.count, train.num_samples()); ++k) {
    train.get_sample(k, tokens.data(), labels.data(), mask.data());
    std::printf("sample %lld:", static_cast<long long>(k));
    if (args.text) {
      std::printf(" %s\n", ByteTokenizer::detokenize(tokens).c_str());
      continue;
    }
    for (const int32_t token : tokens) std::printf(" %d", token);
    const auto masked = std::count(mask.begin(), mask.end(), 0.0f);
    std::printf("  (+ label %d, %lld masked)\n", labels.back(), static_cast<long long>(masked));
  }
  return 0;
}

const Registrar kDataCommand{Command{
    "data", "Megatron indexed datasets: preprocess text/JSONL, inspect, print samples", 40,
    [](CLI::App& app) -> std::function<int()> {
      app.require_subcommand(1);
      auto preprocess_args = std::make_shared<PreprocessArgs>();
      CLI::App* preprocess = app.add_subcommand(
          "preprocess",
          "tokenize .txt/.jsonl into {output-prefix}_{key}_document.bin/.idx (Megatron format)");
      auto& c = preprocess_args->config;
      preprocess
          ->add_option("--input", c.input_path, "input file: .jsonl/.json (one JSON object per line) or text")
          ->required();
      preprocess->add_option("--output-prefix", c.output_prefix, "output path prefix")->required();
      preprocess->add_option("--json-keys", c.json_keys, "JSON keys to extract (one output each)")
          ->default_val(std::vector<std::string>{"text"});
      add_tokenizer_flags(*preprocess, c.tokenizer, true);
      preprocess->add_flag("--append-eod", c.append_eod, "append the EOD token to each document");
      preprocess
          ->add_option("--vocab-size", c.vocab_size,
                       "ids tokenizer: vocabulary size (uint16 below 65500, else int32); default max id + 1")
          ->check(integer_at_least(1));
      preprocess->add_option("--eod-token", c.eod_token, "ids tokenizer: EOD id for --append-eod")
          ->check(integer_at_least(0));
      preprocess
          ->add_option("--text-document", preprocess_args->text_document,
                       "plain text: a document is a paragraph (default), a line or the whole file")
          ->check(CLI::IsMember({"paragraph", "line", "file"}));
      preprocess->add_flag("--overwrite", c.overwrite, "replace existing outputs (refused otherwise)");
      preprocess->add_option("--log-interval", c.log_interval_documents, "progress line every N documents")
          ->check(integer_at_least(1));
      preprocess
          ->add_option("--workers", c.workers,
                       "tokenizing threads (the output is identical for any count; default 1)")
          ->check(integer_between(1, 1024));

      auto info_prefix = std::make_shared<std::string>();
      CLI::App* info = app.add_subcommand("info", "validate a dataset prefix and print its statistics");
      info->add_option("prefix", *info_prefix, "dataset path prefix (without .bin/.idx)")->required();

      auto sample_args = std::make_shared<SampleArgs>();
      CLI::App* sample =
          app.add_subcommand("sample", "print the train samples GPTDataset draws (Megatron order)");
      sample->add_option("--data-path", sample_args->data_path, "PREFIX or W1 PREFIX1 W2 PREFIX2 ...");
      sample->add_flag("--mock-data", sample_args->mock_data, "Megatron-style synthetic data");
      sample->add_option("--split", sample_args->split, "train,valid,test weights");
      sample->add_option("--seq-length", sample_args->seq_length, "tokens per sample")->required();
      sample->add_option("--num-samples", sample_args->num_samples, "train samples requested (0: one epoch)")
          ->check(integer_at_least(0));
      sample->add_option("--seed", sample_args->seed, "numpy RandomState seed (Megatron default 1234)");
      sample->add_option("--vocab-size", sample_args->vocab_size, "token ids must lie below it");
      sample->add_option("--first", sample_args->first, "first sample to print")->check(integer_at_least(0));
      sample->add_option("--count", sample_args->count, "samples to print")->check(integer_at_least(1));
      sample->add_flag("--text", sample_args->text, "print samples as text (byte tokenizer)");
      sample->add_option(
          "--dump-indices", sample_args->dump_indices,
          "write PREFIX-{document,sample,shuffle}_index.npy to compare with Megatron's index cache");

      return [preprocess, preprocess_args, info, info_prefix, sample, sample_args]() -> int {
        if (preprocess->parsed()) return run_preprocess(*preprocess_args);
        if (info->parsed()) return run_data_info(*info_prefix);
        if (sample->parsed()) return run_sample(*sample_args);
        return 1;
      };
    }}};

}  // namespace
}  // namespace megatune::tools
