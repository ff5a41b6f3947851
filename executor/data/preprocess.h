// preprocess_data: Megatron's tools/preprocess_data.py: text or JSONL in, tokenized by Megatron's tokenizer
// types (or megatune's byte tokenizer, or given ids) on --workers threads, {output_prefix}_{key}_document
// .bin/.idx out.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "executor/data/index_dtype.h"
#include "executor/data/tokenizer.h"

namespace megatune::executor::data {

enum class TextDocumentMode { paragraph, line, file };

struct PreprocessConfig {
  std::string input_path;  // .jsonl/.json: one JSON object per line; anything else: plain text
  std::string output_prefix;
  std::vector<std::string> json_keys{"text"};  // --json-keys
  // --tokenizer-type and its files (tokenizer.h); type "ids": the key holds token id arrays.
  TokenizerFiles tokenizer;
  int workers = 1;  // --workers: tokenizing threads (the output is the same for any count)
  // Plain-text input: a document is a paragraph (lines up to a blank line; the default), a line, or the
  // whole file. Newlines inside a document are kept as byte 10.
  TextDocumentMode text_document_mode = TextDocumentMode::paragraph;
  bool append_eod = false;  // --append-eod: EOD token after each document
  // ids tokenizer: vocabulary size (decides uint16 vs int32 and bounds the ids); 0 = max id + 1, found by a
  // first pass over the input. EOD for --append-eod with ids is eod_token (required then).
  int64_t vocab_size = 0;
  int64_t eod_token = -1;
  bool overwrite = false;  // replace existing outputs; without it existing outputs are a UserError
  int64_t log_interval_documents = 10000;  // progress callback period
};

struct PreprocessProgress {
  int64_t documents = 0;
  int64_t tokens = 0;
  int64_t input_bytes_read = 0;
  int64_t input_bytes_total = 0;
  double elapsed_s = 0;
};

struct PreprocessOutput {
  std::string json_key;
  std::string path_prefix;  // {output_prefix}_{key}_document
  IndexDType dtype = IndexDType::uint16;
  int64_t documents = 0;
  int64_t tokens = 0;
};

struct PreprocessResult {
  std::vector<PreprocessOutput> outputs;  // one per json key (one for plain text: key "text")
  int64_t skipped_empty_documents = 0;    // Megatron skips documents that tokenize to nothing
  double elapsed_s = 0;
};

// --json-keys: at least one, and none twice (each key is an output of its own); UserError otherwise.
void check_json_keys(const std::vector<std::string>& keys);

// Writes every output under a temporary name and renames it into place only when the whole input was
// processed, so a failure never leaves a partial dataset or destroys an existing one. Throws UserError
// for a missing input, bad --json-keys, an existing output (without overwrite), a bad JSON line or a missing
// key
// ("FILE:LINE: ..."), ids that do not fit the vocabulary.
PreprocessResult preprocess_data(const PreprocessConfig& config,
                                 const std::function<void(const PreprocessProgress&)>& on_progress = {});

}  // namespace megatune::executor::data
