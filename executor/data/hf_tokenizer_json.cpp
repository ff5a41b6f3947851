// HuggingFaceTokenizer: a tokenizer.json of a byte-level BPE model (GPT-2's, Llama 3's): vocab and merges,
// the pre-tokenizer (ByteLevel's own regex, or a Split regex before ByteLevel), added tokens, and the
// template post-processor's ids around each document; the end-of-document token from tokenizer_config.json
// beside it when present.
#include <filesystem>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "base/input_file.h"
#include "base/user_error.h"
#include "executor/data/bpe_tokenizer.h"

namespace megatune::executor::data {
namespace {

using nlohmann::json;

const std::string kFlag = "--tokenizer-model";

[[noreturn]] void refuse(const std::string& path, const std::string& what) {
  throw UserError(kFlag + " " + path + ": " + what);
}

json parse(const std::string& path) {
  try {
    return json::parse(read_regular_file(path, kFlag));
  } catch (const json::parse_error& e) {
    refuse(path, "not valid JSON (byte " + std::to_string(e.byte) + "); give a tokenizer.json");
  }
}

std::string type_of(const json& node) { return node.is_object() ? node.value("type", "") : ""; }

// The pre-tokenizer: ByteLevel (GPT-2's regex unless use_regex is false), or a Sequence of a Split regex
// (behavior Isolated) and ByteLevel without regex.
void read_pre_tokenizer(const json& node, const std::string& path, ByteLevelBpeSpec& spec) {
  const auto byte_level = [&](const json& b, bool regex_expected) {
    spec.add_prefix_space = b.value("add_prefix_space", false);
    if (b.value("use_regex", true) != regex_expected)
      refuse(path, "ByteLevel pre-tokenizer with use_regex " +
                       std::string(regex_expected ? "false" : "true") + " in this position is not supported");
  };
  if (type_of(node) == "ByteLevel") {
    byte_level(node, true);
    spec.pattern = PreTokenizerPattern::kGpt2;
    return;
  }
  const json& steps = node.is_object() ? node.value("pretokenizers", json::array()) : json::array();
  if (type_of(node) != "Sequence" || steps.size() != 2 || type_of(steps[0]) != "Split" ||
      type_of(steps[1]) != "ByteLevel")
    refuse(path, "pre-tokenizer " + (node.is_null() ? std::string("null") : node.dump().substr(0, 80)) +
                     " is not a byte-level BPE one (ByteLevel, or Split + ByteLevel)");
  const json& split = steps[0];
  const std::string regex = split.value("pattern", json::object()).value("Regex", "");
  const auto pattern = pretokenizer_pattern_of(regex);
  if (!pattern || split.value("behavior", "") != "Isolated" || split.value("invert", false))
    refuse(path, "Split pre-tokenizer regex " + regex +
                     " is not one megatune implements (GPT-2's, cl100k_base's / Llama 3's, Megatron's v1)");
  spec.pattern = *pattern;
  byte_level(steps[1], false);
}

// TemplateProcessing's "single" template: the special tokens' ids before and after the sequence.
void read_post_processor(const json& node, const std::string& path, ByteLevelBpeSpec& spec) {
  if (node.is_null() || type_of(node) == "ByteLevel") return;
  if (type_of(node) == "Sequence") {
    for (const json& step : node.value("processors", json::array())) read_post_processor(step, path, spec);
    return;
  }
  if (type_of(node) != "TemplateProcessing")
    refuse(path, "post-processor " + type_of(node) + " is not supported (ByteLevel or TemplateProcessing)");
  bool after = false;
  for (const json& item : node.value("single", json::array())) {
    if (item.contains("Sequence")) {
      after = true;
      continue;
    }
    const std::string name = item.value("SpecialToken", json::object()).value("id", "");
    const json& special = node.value("special_tokens", json::object());
    if (!special.contains(name)) refuse(path, "template token " + name + " is not in its special_tokens");
    for (const json& id : special[name].value("ids", json::array()))
      (after ? spec.suffix_ids : spec.prefix_ids).push_back(id.get<std::int32_t>());
  }
}

void read_model(const json& model, const std::string& path, ByteLevelBpeSpec& spec) {
  if (!model.is_object()) refuse(path, "its \"model\" is not an object; give a tokenizer.json");
  if (type_of(model) != "BPE") refuse(path, "model type " + type_of(model) + " is not BPE");
  if (model.value("byte_fallback", false) || !model.value("continuing_subword_prefix", json()).is_null() ||
      !model.value("end_of_word_suffix", json()).is_null())
    refuse(path, "BPE options byte_fallback / subword prefix / word suffix are not supported");
  std::unordered_map<std::string, std::int32_t> vocab;
  std::string bytes;
  const json vocab_node = model.value("vocab", json::object());
  VocabularyIds ids(kFlag + " " + path);
  for (const auto& [token, id] : vocab_node.items()) {
    ids.add(token, id.get<std::int32_t>());
    if (byte_level_to_bytes(token, bytes)) vocab[bytes] = id.get<std::int32_t>();
  }
  std::vector<std::pair<std::string, std::string>> merges;
  for (const json& merge : model.value("merges", json::array())) {
    std::string left, right;
    if (merge.is_array() && merge.size() == 2) {
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    } else if (merge.is_string() && merge.get<std::string>().find(' ') != std::string::npos) {
      const std::string text = merge.get<std::string>();
      left = text.substr(0, text.find(' '));
      right = text.substr(text.find(' ') + 1);
    } else {
      refuse(path, "merge " + merge.dump() + " is neither \"LEFT RIGHT\" nor [LEFT, RIGHT]");
    }
    std::string l, r;
    if (!byte_level_to_bytes(left, l) || !byte_level_to_bytes(right, r))
      refuse(path, "merge " + merge.dump() + " is not in GPT-2's byte-level alphabet");
    merges.emplace_back(l, r);
  }
  try {
    spec.encoder = BytePairEncoder::from_merges(std::move(vocab), merges);
  } catch (const std::invalid_argument& e) {
    refuse(path, e.what());
  }
  spec.encoder.set_whole_piece_first(model.value("ignore_merges", false));
}

// tokenizer_config.json's eos_token (a string or {"content": ...}), else a known end-of-text token.
std::int32_t end_of_document(const std::string& path, const ByteLevelBpeSpec& spec) {
  const auto id_of = [&](const std::string& text) -> std::int32_t {
    for (const auto& [token, id] : spec.added_tokens)
      if (token == text) return id;
    return spec.encoder.find(text);
  };
  const std::filesystem::path config = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  std::error_code error;
  if (std::filesystem::is_regular_file(config, error)) {
    const json c = json::parse(read_regular_file(config.string(), "tokenizer_config.json"), nullptr, false);
    const json eos = c.is_object() ? c.value("eos_token", json()) : json();
    const std::string text = eos.is_string()   ? eos.get<std::string>()
                             : eos.is_object() ? eos.value("content", "")
                                               : "";
    if (!text.empty() && id_of(text) >= 0) return id_of(text);
  }
  for (const char* text : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"})
    if (id_of(text) >= 0) return id_of(text);
  refuse(path, "no end-of-document token found; put its tokenizer_config.json (with eos_token) beside it");
}

ByteLevelBpeSpec read_tokenizer_json(const std::string& path) {
  const json root = parse(path);
  if (!root.is_object() || !root.contains("model")) refuse(path, "no \"model\"; give a tokenizer.json");
  if (!root.value("normalizer", json()).is_null())
    refuse(path, "normalizer " + type_of(root["normalizer"]) + " is not supported (byte-level BPE has none)");
  ByteLevelBpeSpec spec;
  read_model(root["model"], path, spec);
  read_pre_tokenizer(root.value("pre_tokenizer", json()), path, spec);
  read_post_processor(root.value("post_processor", json()), path, spec);
  std::int64_t max_id = spec.encoder.max_id();
  for (const json& added : root.value("added_tokens", json::array())) {
    spec.added_tokens.emplace_back(added.value("content", ""), added.value("id", -1));
    max_id = std::max<std::int64_t>(max_id, spec.added_tokens.back().second);
  }
  spec.vocab_size = max_id + 1;
  spec.eod_id = end_of_document(path, spec);
  return spec;
}

}  // namespace

ByteLevelBpeSpec hugging_face_spec(const std::string& path) {
  if (path.empty())
    throw UserError("--tokenizer-type HuggingFaceTokenizer needs --tokenizer-model (a tokenizer.json file)");
  try {
    return read_tokenizer_json(path);
  } catch (const json::exception& e) {
    refuse(path, std::string("unexpected structure (") + e.what() + "); give a tokenizer.json");
  }
}

}  // namespace megatune::executor::data
