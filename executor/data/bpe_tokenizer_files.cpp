// Readers of GPT-2's vocab.json + merges.txt and of tiktoken's rank files (base64 lines, or Megatron's
// JSON list) into byte-level BPE specs.
#include <algorithm>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "base/input_file.h"
#include "base/user_error.h"
#include "executor/data/bpe_tokenizer.h"

namespace megatune::executor::data {
namespace {

using nlohmann::json;

json parse_json_file(const std::string& path, const std::string& flag) {
  const std::string text = read_regular_file(path, flag);
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    throw UserError(flag + " " + path + " is not valid JSON (byte " + std::to_string(e.byte) +
                    "); give the tokenizer's own file");
  }
}

std::string to_bytes(const std::string& byte_level, const std::string& flag, const std::string& path) {
  std::string bytes;
  if (!byte_level_to_bytes(byte_level, bytes))
    throw UserError(flag + " " + path + ": token '" + byte_level +
                    "' is not in GPT-2's byte-level alphabet; give a byte-level BPE vocabulary");
  return bytes;
}

std::string decode_base64(std::string_view text) {
  std::string out;
  int buffer = 0, bits = 0;
  for (const char c : text) {
    int v = c >= 'A' && c <= 'Z'   ? c - 'A'
            : c >= 'a' && c <= 'z' ? c - 'a' + 26
            : c >= '0' && c <= '9' ? c - '0' + 52
            : c == '+'             ? 62
            : c == '/'             ? 63
                                   : -1;
    if (c == '=') break;
    if (v < 0) throw std::invalid_argument("not base64");
    buffer = (buffer << 6) | v;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((buffer >> bits) & 0xFF));
    }
  }
  return out;
}

// tiktoken ranks: "BASE64 RANK" lines (.tiktoken), or Megatron's JSON list of {rank, token_bytes, token_str}.
std::unordered_map<std::string, std::int32_t> read_ranks(const std::string& path) {
  const std::string flag = "--tokenizer-model";
  std::unordered_map<std::string, std::int32_t> ranks;
  VocabularyIds ids(flag + " " + path);
  if (path.size() >= 5 && path.substr(path.size() - 5) == ".json") {
    const json list = parse_json_file(path, flag);
    if (!list.is_array()) throw UserError(flag + " " + path + " is not a JSON list of {rank, token_bytes}");
    for (const json& entry : list) {
      if (!entry.is_object() || !entry.contains("rank") || !entry.contains("token_bytes"))
        throw UserError(flag + " " + path +
                        ": an entry lacks rank or token_bytes; give Megatron's tiktoken JSON");
      ids.add(entry["token_bytes"].get<std::string>(), entry["rank"].get<std::int32_t>());
      ranks[decode_base64(entry["token_bytes"].get<std::string>())] = entry["rank"].get<std::int32_t>();
    }
    return ranks;
  }
  std::istringstream lines(read_regular_file(path, flag));
  std::string line;
  for (int number = 1; std::getline(lines, line); ++number) {
    if (line.empty()) continue;
    const std::size_t space = line.find(' ');
    std::int32_t rank = 0;
    try {
      if (space == std::string::npos) throw std::invalid_argument("no rank");
      rank = std::stoi(line.substr(space + 1));
      ranks[decode_base64(std::string_view(line).substr(0, space))] = rank;
    } catch (const std::exception&) {
      throw UserError(flag + " " + path + ":" + std::to_string(number) +
                      ": not a 'BASE64 RANK' line; give a tiktoken ranks file");
    }
    ids.add(line.substr(0, space), rank);
  }
  return ranks;
}

}  // namespace

void VocabularyIds::add(const std::string& token, std::int32_t id) {
  const auto [at, fresh] = token_of_id_.emplace(id, token);
  if (!fresh)
    throw UserError(where_ + ": tokens '" + at->second + "' and '" + token + "' share id " +
                    std::to_string(id) + " (they would encode as one); give each token an id of its own");
}

ByteLevelBpeSpec gpt2_bpe_spec(const std::string& vocab_file, const std::string& merge_file) {
  if (vocab_file.empty() || merge_file.empty())
    throw UserError(
        "--tokenizer-type GPT2BPETokenizer needs --vocab-file (vocab.json) and --merge-file (merges.txt)");
  const json vocab = parse_json_file(vocab_file, "--vocab-file");
  if (!vocab.is_object())
    throw UserError("--vocab-file " + vocab_file + " is not a JSON object of token -> id");
  std::unordered_map<std::string, std::int32_t> tokens;
  VocabularyIds ids("--vocab-file " + vocab_file);
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer())
      throw UserError("--vocab-file " + vocab_file + ": id of '" + token + "' is not an integer");
    ids.add(token, id.get<std::int32_t>());
    tokens[to_bytes(token, "--vocab-file", vocab_file)] = id.get<std::int32_t>();
  }
  std::vector<std::pair<std::string, std::string>> merges;
  std::istringstream lines(read_regular_file(merge_file, "--merge-file"));
  std::string line;
  for (int number = 1; std::getline(lines, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (number == 1 && line.rfind("#version", 0) == 0)) continue;
    const std::size_t space = line.find(' ');
    if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos)
      throw UserError("--merge-file " + merge_file + ":" + std::to_string(number) +
                      ": not a 'LEFT RIGHT' merge; give GPT-2's merges.txt");
    merges.emplace_back(to_bytes(line.substr(0, space), "--merge-file", merge_file),
                        to_bytes(line.substr(space + 1), "--merge-file", merge_file));
  }
  ByteLevelBpeSpec spec;
  try {
    spec.encoder = BytePairEncoder::from_merges(std::move(tokens), merges);
  } catch (const std::invalid_argument& e) {
    throw UserError("--vocab-file " + vocab_file + " and --merge-file " + merge_file +
                    " disagree: " + e.what());
  }
  spec.pattern = PreTokenizerPattern::kGpt2;
  spec.vocab_size = static_cast<std::int64_t>(vocab.size());
  spec.eod_id = spec.encoder.find("<|endoftext|>");  // Megatron: encoder['<|endoftext|>']
  if (spec.eod_id < 0)
    throw UserError("--vocab-file " + vocab_file + " has no <|endoftext|> token (GPT-2's end of document)");
  return spec;
}

ByteLevelBpeSpec tiktoken_spec(const TokenizerFiles& files) {
  if (files.tokenizer_model.empty())
    throw UserError("--tokenizer-type TikTokenizer needs --tokenizer-model (a tiktoken ranks file)");
  ByteLevelBpeSpec spec;
  if (files.tiktoken_pattern == "v1") {
    spec.pattern = PreTokenizerPattern::kTiktokenV1;
  } else if (files.tiktoken_pattern == "v2") {
    spec.pattern = PreTokenizerPattern::kTiktokenV2;
  } else if (files.tiktoken_pattern == "cl100k") {
    spec.pattern = PreTokenizerPattern::kCl100k;
  } else {
    throw UserError("--tiktoken-pattern " + files.tiktoken_pattern +
                    " is not available; give v1 or v2 (Megatron's) or cl100k (cl100k_base's and Llama 3's)");
  }
  std::vector<std::string> special = files.tiktoken_special_tokens;
  if (special.empty()) special = {"<unk>", "<s>", "</s>"};
  if (static_cast<int>(special.size()) > files.tiktoken_num_special_tokens)
    throw UserError("--tiktoken-special-tokens lists more tokens than --tiktoken-num-special-tokens " +
                    std::to_string(files.tiktoken_num_special_tokens) + "; raise it");
  const auto eos = std::find(special.begin(), special.end(), "</s>");
  if (eos == special.end())
    throw UserError("--tiktoken-special-tokens must include </s> (the end of document)");
  const auto ranks = read_ranks(files.tokenizer_model);
  try {
    // Megatron's ids: the special tokens first, then rank + --tiktoken-num-special-tokens.
    spec.encoder = BytePairEncoder::from_ranks(ranks, files.tiktoken_num_special_tokens);
  } catch (const std::invalid_argument& e) {
    throw UserError("--tokenizer-model " + files.tokenizer_model + ": " + e.what());
  }
  spec.vocab_size = spec.encoder.max_id() + 1;
  spec.eod_id = static_cast<std::int32_t>(eos - special.begin());
  return spec;
}

}  // namespace megatune::executor::data
