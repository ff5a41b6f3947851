// preprocess_data: text/JSONL -> Megatron indexed datasets with the byte or ids tokenizer, written under
// temporary names and renamed into place only on success.
#include "executor/data/preprocess.h"

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>

#include "executor/data/byte_tokenizer.h"
#include "executor/data/indexed_dataset.h"
#include "executor/data/indexed_dataset_writer.h"
#include "executor/data/json_line.h"
#include "layouts/input_file.h"
#include "layouts/user_error.h"

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

}  // namespace

PreprocessResult preprocess_data(const PreprocessConfig& config,
                                 const std::function<void(const PreprocessProgress&)>& on_progress) {
  const auto start = std::chrono::steady_clock::now();
  const auto elapsed_s = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  if (config.output_prefix.empty())
    throw UserError("--output-prefix is empty; give a path prefix for the outputs");
  if (config.json_keys.empty()) throw UserError("--json-keys is empty; give the key that holds the text");
  std::error_code error;
  if (!fs::is_regular_file(config.input_path, error)) {
    throw UserError("--input " + config.input_path +
                    " is not a readable file; give an existing .txt or .jsonl file");
  }
  const bool jsonl = is_jsonl(config.input_path);
  const bool ids = config.tokenizer_type == TokenizerType::ids;
  if (ids && !jsonl) {
    throw UserError("--tokenizer-type ids needs a .jsonl --input whose lines hold token id arrays, got " +
                    config.input_path);
  }
  const std::vector<std::string> keys =
      jsonl ? config.json_keys : std::vector<std::string>{config.json_keys.front()};
  const int64_t input_bytes_total = static_cast<int64_t>(fs::file_size(config.input_path, error));

  // Vocabulary and EOD.
  int64_t vocab_size = ByteTokenizer::kVocabSize;
  int64_t eod_token = ByteTokenizer::kEodToken;
  if (ids) {
    eod_token = config.eod_token;
    if (config.append_eod && eod_token < 0) {
      throw UserError(
          "--append-eod with --tokenizer-type ids needs --eod-token (the EOD id of your tokenizer)");
    }
    vocab_size = config.vocab_size;
    if (vocab_size <= 0) {  // first pass: the largest id decides the dtype
      std::ifstream input = open_input(config.input_path);
      std::string line;
      int64_t line_number = 0;
      int64_t max_id = std::max<int64_t>(eod_token, 0);
      while (std::getline(input, line)) {
        ++line_number;
        if (is_blank(line)) continue;
        try {
          const JsonLine json(line);
          for (const auto& key : keys) {
            for (const int64_t id : json.integer_array_field(key)) max_id = std::max(max_id, id);
          }
        } catch (const JsonLineError& e) {
          throw UserError(config.input_path + ":" + std::to_string(line_number) + ": " + e.what() +
                          "; fix the line or remove it");
        }
      }
      vocab_size = max_id + 1;
    }
    if (config.append_eod && eod_token >= vocab_size) {
      throw UserError("--eod-token " + std::to_string(eod_token) + " is outside --vocab-size " +
                      std::to_string(vocab_size));
    }
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
    std::vector<int32_t> tokens;
    std::vector<int64_t> token_ids;
    // Adds one document's tokens (already in `tokens`/`token_ids`) to output `o`.
    const auto add_document = [&](PendingOutput& pending, bool use_ids) {
      if (use_ids) {
        if (config.append_eod && !token_ids.empty()) token_ids.push_back(eod_token);
        for (const int64_t id : token_ids) {
          if (id < 0 || id >= vocab_size) {
            throw UserError("token id " + std::to_string(id) + " is outside --vocab-size " +
                            std::to_string(vocab_size));
          }
        }
        if (!token_ids.empty())
          pending.writer->add_sequence(std::span<const int64_t>(token_ids));
        else
          ++result.skipped_empty_documents;
        pending.output.tokens += static_cast<int64_t>(token_ids.size());
      } else {
        if (config.append_eod && !tokens.empty()) tokens.push_back(static_cast<int32_t>(eod_token));
        if (!tokens.empty())
          pending.writer->add_sequence(std::span<const int32_t>(tokens));
        else
          ++result.skipped_empty_documents;
        pending.output.tokens += static_cast<int64_t>(tokens.size());
      }
      // Megatron ends the document even when it is empty (a document of zero sequences).
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
          for (auto& pending : outputs) {
            if (ids) {
              token_ids = json.integer_array_field(pending.output.json_key);
            } else {
              tokens.clear();
              ByteTokenizer::tokenize(json.string_field(pending.output.json_key), tokens);
            }
            add_document(pending, ids);
          }
        } catch (const JsonLineError& e) {
          throw UserError(config.input_path + ":" + std::to_string(line_number) + ": " + e.what() +
                          "; fix the line or remove it");
        } catch (const UserError& e) {
          throw UserError(config.input_path + ":" + std::to_string(line_number) + ": " + e.what());
        }
        report();
      }
    } else {
      PendingOutput& pending = outputs.front();
      std::string document;
      const auto flush = [&] {
        if (document.empty()) return;
        tokens.clear();
        ByteTokenizer::tokenize(document, tokens);
        add_document(pending, false);
        document.clear();
        report();
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
