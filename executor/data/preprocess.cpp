// preprocess_data: text/JSONL -> Megatron indexed datasets, tokenized in batches on the tokenizer pool,
// written under temporary names and renamed into place only on success.
#include "executor/data/preprocess.h"

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>

#include "base/input_file.h"
#include "base/user_error.h"
#include "executor/data/indexed_dataset.h"
#include "executor/data/indexed_dataset_writer.h"
#include "executor/data/json_line.h"
#include "executor/data/tokenizer_pool.h"

namespace megatune::executor::data {

namespace {

namespace fs = std::filesystem;

bool is_jsonl(const std::string& path) {
  const std::string extension = fs::path(path).extension().string();
  return extension == ".jsonl" || extension == ".json" || extension == ".ndjson";
}

bool is_blank(const std::string& line) { return line.find_first_not_of(" \t\r\n") == std::string::npos; }

std::ifstream open_input(const std::string& path) {
  require_regular_file(path,
                       "--input");  // a FIFO or directory fails here instead of hanging or reading nothing
  std::ifstream input(path, std::ios::binary);
  if (!input) {
    throw UserError("cannot read --input " + path +
                    (fs::exists(path) ? ": permission denied" : ": no such file") +
                    "; give an existing .txt or .jsonl file");
  }
  return input;
}

// One output dataset being written under temporary names.
struct PendingOutput {
  PreprocessOutput output;
  std::string temporary_prefix;
  std::unique_ptr<IndexedDatasetWriter> writer;
};

// Documents read but not yet tokenized: their texts and the output each goes to, in input order.
struct DocumentBatch {
  std::vector<std::string> texts;
  std::vector<std::size_t> outputs;
  std::size_t bytes = 0;
  bool full() const { return texts.size() >= 8192 || bytes >= (std::size_t{8} << 20); }
};

// The largest id of a token-id JSONL input (its vocabulary when none is given): a first pass.
int64_t max_token_id(const std::string& path, const std::vector<std::string>& keys, int64_t at_least) {
  std::ifstream input = open_input(path);
  std::string line;
  int64_t line_number = 0, max_id = at_least;
  while (std::getline(input, line)) {
    ++line_number;
    if (is_blank(line)) continue;
    try {
      const JsonLine json(line);
      for (const auto& key : keys)
        for (const int64_t id : json.integer_array_field(key)) max_id = std::max(max_id, id);
    } catch (const JsonLineError& e) {
      throw UserError(path + ":" + std::to_string(line_number) + ": " + e.what() +
                      "; fix the line or remove it");
    }
  }
  return max_id;
}

}  // namespace

void check_json_keys(const std::vector<std::string>& keys) {
  if (keys.empty()) throw UserError("--json-keys is empty; give the key that holds the text");
  std::set<std::string> seen;
  for (const std::string& key : keys)
    if (!seen.insert(key).second)
      throw UserError("--json-keys names '" + key +
                      "' twice; give each key once (each key is one output dataset)");
}

PreprocessResult preprocess_data(const PreprocessConfig& config,
                                 const std::function<void(const PreprocessProgress&)>& on_progress) {
  const auto start = std::chrono::steady_clock::now();
  const auto elapsed_s = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  if (config.output_prefix.empty())
    throw UserError("--output-prefix is empty; give a path prefix for the outputs");
  check_json_keys(config.json_keys);
  if (config.workers < 1 || config.workers > 1024)
    throw UserError("--workers " + std::to_string(config.workers) + " is outside 1..1024");
  std::error_code error;
  if (!fs::is_regular_file(config.input_path, error)) {
    throw UserError("--input " + config.input_path +
                    " is not a readable file; give an existing .txt or .jsonl file");
  }
  const bool jsonl = is_jsonl(config.input_path);
  const bool ids = config.tokenizer.type == "ids";
  if (ids && !jsonl) {
    throw UserError("--tokenizer-type ids needs a .jsonl --input whose lines hold token id arrays, got " +
                    config.input_path);
  }
  const std::vector<std::string> keys =
      jsonl ? config.json_keys : std::vector<std::string>{config.json_keys.front()};
  const int64_t input_bytes_total = static_cast<int64_t>(fs::file_size(config.input_path, error));

  // Tokenizer, vocabulary and EOD.
  std::unique_ptr<TextTokenizer> tokenizer;
  int64_t vocab_size = 0, eod_token = config.eod_token;
  if (ids) {
    if (config.append_eod && eod_token < 0) {
      throw UserError(
          "--append-eod with --tokenizer-type ids needs --eod-token (the EOD id of your tokenizer)");
    }
    vocab_size = config.vocab_size > 0
                     ? config.vocab_size
                     : max_token_id(config.input_path, keys, std::max<int64_t>(eod_token, 0)) + 1;
    if (config.append_eod && eod_token >= vocab_size) {
      throw UserError("--eod-token " + std::to_string(eod_token) + " is outside --vocab-size " +
                      std::to_string(vocab_size));
    }
  } else {
    tokenizer = make_tokenizer(config.tokenizer);
    vocab_size = tokenizer->vocab_size();
    eod_token = tokenizer->eod_id();
    if (config.append_eod && eod_token < 0)
      throw UserError("--append-eod: --tokenizer-type " + config.tokenizer.type +
                      " has no end-of-document token");
  }
  const IndexDType dtype = optimal_index_dtype(vocab_size);

  // Outputs: refuse to replace existing data unless asked.
  std::vector<PendingOutput> outputs;
  for (const auto& key : keys) {
    PendingOutput pending;
    pending.output.json_key = key;
    pending.output.path_prefix = config.output_prefix + "_" + key + "_document";
    pending.output.dtype = dtype;
    pending.temporary_prefix = pending.output.path_prefix + ".partial-" + std::to_string(::getpid());
    for (const auto& path :
         {data_file_path(pending.output.path_prefix), index_file_path(pending.output.path_prefix)}) {
      if (fs::exists(path, error) && !config.overwrite) {
        throw UserError("output " + path +
                        " already exists; pass --overwrite to replace it or choose another "
                        "--output-prefix");
      }
    }
    outputs.push_back(std::move(pending));
  }
  const fs::path parent = fs::path(config.output_prefix).parent_path();
  if (!parent.empty()) {
    fs::create_directories(parent, error);
    if (error) {
      throw UserError("cannot create output directory " + parent.string() + ": " + error.message());
    }
  }

  PreprocessResult result;
  const auto remove_temporaries = [&] {
    for (auto& pending : outputs) {
      pending.writer.reset();
      std::error_code ignored;
      fs::remove(data_file_path(pending.temporary_prefix), ignored);
      fs::remove(index_file_path(pending.temporary_prefix), ignored);
    }
  };
  try {
    for (auto& pending : outputs) {
      pending.writer = std::make_unique<IndexedDatasetWriter>(
          data_file_path(pending.temporary_prefix), index_file_path(pending.temporary_prefix), dtype);
    }
    PreprocessProgress progress;
    progress.input_bytes_total = input_bytes_total;
    int64_t documents = 0;
    // Adds one document's tokens to output `o` (EOD appended when asked; Megatron ends the document even
    // when it is empty: a document of zero sequences).
    const auto add_document = [&](PendingOutput& pending, std::vector<int64_t>& tokens) {
      if (config.append_eod && !tokens.empty()) tokens.push_back(eod_token);
      for (const int64_t id : tokens) {
        if (id < 0 || id >= vocab_size) {
          throw UserError("token id " + std::to_string(id) + " is outside --vocab-size " +
                          std::to_string(vocab_size));
        }
      }
      if (!tokens.empty())
        pending.writer->add_sequence(std::span<const int64_t>(tokens));
      else
        ++result.skipped_empty_documents;
      pending.output.tokens += static_cast<int64_t>(tokens.size());
      pending.writer->end_document();
      ++pending.output.documents;
    };
    const auto report = [&] {
      ++documents;
      if (on_progress && config.log_interval_documents > 0 &&
          documents % config.log_interval_documents == 0) {
        progress.documents = documents;
        progress.tokens = 0;
        for (const auto& pending : outputs) progress.tokens += pending.output.tokens;
        progress.elapsed_s = elapsed_s();
        on_progress(progress);
      }
    };
    std::unique_ptr<TokenizerPool> pool;
    if (tokenizer) pool = std::make_unique<TokenizerPool>(*tokenizer, config.workers);
    DocumentBatch batch;
    std::vector<std::vector<int32_t>> batch_ids;
    std::vector<int64_t> tokens;
    // Tokenizes the batch on the pool and writes its documents in input order.
    const auto flush_batch = [&] {
      pool->tokenize(batch.texts, batch_ids);
      for (std::size_t d = 0; d < batch.texts.size(); ++d) {
        tokens.assign(batch_ids[d].begin(), batch_ids[d].end());
        add_document(outputs[batch.outputs[d]], tokens);
        if (batch.outputs[d] + 1 == outputs.size()) report();
      }
      batch = DocumentBatch{};
    };
    const auto add_text = [&](std::size_t output, std::string text) {
      batch.bytes += text.size();
      batch.texts.push_back(std::move(text));
      batch.outputs.push_back(output);
      if (batch.full()) flush_batch();
    };

    std::ifstream input = open_input(config.input_path);
    std::string line;
    int64_t line_number = 0;
    if (jsonl) {
      while (std::getline(input, line)) {
        ++line_number;
        progress.input_bytes_read += static_cast<int64_t>(line.size()) + 1;
        if (is_blank(line)) continue;
        try {
          const JsonLine json(line);
          for (std::size_t o = 0; o < outputs.size(); ++o) {
            if (!ids) {
              add_text(o, json.string_field(outputs[o].output.json_key));
              continue;
            }
            tokens = json.integer_array_field(outputs[o].output.json_key);
            add_document(outputs[o], tokens);
          }
        } catch (const JsonLineError& e) {
          throw UserError(config.input_path + ":" + std::to_string(line_number) + ": " + e.what() +
                          "; fix the line or remove it");
        } catch (const UserError& e) {
          throw UserError(config.input_path + ":" + std::to_string(line_number) + ": " + e.what());
        }
        if (ids) report();
      }
    } else {
      std::string document;
      const auto flush = [&] {
        if (document.empty()) return;
        add_text(0, std::move(document));
        document.clear();
      };
      while (std::getline(input, line)) {
        ++line_number;
        progress.input_bytes_read += static_cast<int64_t>(line.size()) + 1;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        switch (config.text_document_mode) {
          case TextDocumentMode::line:
            document = line;
            if (!is_blank(document)) flush();
            document.clear();
            break;
          case TextDocumentMode::paragraph:
            if (is_blank(line)) {
              flush();
            } else {
              if (!document.empty()) document.push_back('\n');
              document += line;
            }
            break;
          case TextDocumentMode::file:
            document += line;
            document.push_back('\n');
            break;
        }
      }
      flush();
    }
    if (pool && !batch.texts.empty()) flush_batch();
    if (input.bad()) throw UserError("error reading --input " + config.input_path);
    for (auto& pending : outputs) {
      pending.writer->finalize();
      pending.output.documents = pending.writer->num_documents();
      pending.output.tokens = pending.writer->num_tokens();
      pending.writer.reset();
      fs::rename(data_file_path(pending.temporary_prefix), data_file_path(pending.output.path_prefix));
      fs::rename(index_file_path(pending.temporary_prefix), index_file_path(pending.output.path_prefix));
      result.outputs.push_back(pending.output);
    }
  } catch (const fs::filesystem_error& e) {
    remove_temporaries();
    throw UserError(std::string("cannot move the outputs into place: ") + e.what());
  } catch (...) {
    remove_temporaries();
    throw;
  }
  result.elapsed_s = elapsed_s();
  return result;
}

}  // namespace megatune::executor::data
