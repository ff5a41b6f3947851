// Plans on one node with `megatune plan -o`, then runs the megatune command it wrote through
// `megatune train --dry-run --device cpu`, for tests that the emitted command builds the planned model and
// layout (the "model:" and "settings:" lines both print).
#pragma once
#include <sstream>
#include <string>
#include <vector>

#include "cli_harness.h"

namespace megatune::tests {

// Splits a shell line as plan quotes it: words separated by spaces, '...' quoting, \ escaping one character.
inline std::vector<std::string> shell_words(const std::string& line) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false, quoted = false, escaped = false;
  for (char ch : line) {
    if (escaped) {
      word += ch;
      escaped = false;
    } else if (quoted) {
      if (ch == '\'')
        quoted = false;
      else
        word += ch;
    } else if (ch == '\'') {
      quoted = in_word = true;
    } else if (ch == '\\') {
      escaped = in_word = true;
    } else if (ch == ' ' || ch == '\n') {
      if (in_word) words.push_back(word);
      word.clear();
      in_word = false;
    } else {
      word += ch;
      in_word = true;
    }
  }
  if (in_word) words.push_back(word);
  return words;
}

// The text after `prefix` on the first line starting with it ("" when none).
inline std::string line_after(const std::string& text, const std::string& prefix) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(prefix, 0) == 0) return line.substr(prefix.size());
  return "";
}

struct PlanAndDryRun {
  CliResult planned;          // megatune plan
  CliResult dry;              // the emitted megatune command with --dry-run (not run when plan failed)
  std::string megatune_args;  // <stem>.megatune.args
  std::string megatron_args;  // <stem>.megatron.args
};

// `megatune plan --cluster 1x8xH100 --threads 2 -o DIR/plan.json <flags>`, then its megatune command.
inline PlanAndDryRun plan_then_dry_run(const std::vector<std::string>& flags) {
  const TempDir dir;
  std::vector<std::string> plan = {"plan", "--cluster", "1x8xH100",       "--threads",
                                   "2",    "-o",        dir / "plan.json"};
  plan.insert(plan.end(), flags.begin(), flags.end());
  PlanAndDryRun out;
  out.planned = run_megatune(plan, 120);
  if (out.planned.exit_code != 0) return out;
  out.megatune_args = read_text(dir / "plan.megatune.args");
  out.megatron_args = read_text(dir / "plan.megatron.args");
  std::vector<std::string> train = shell_words(out.megatune_args);
  if (train.empty() || train[0] != "megatune") return out;
  train.erase(train.begin());  // run_megatune names the binary
  train.insert(train.end(), {"--dry-run", "--device", "cpu"});
  out.dry = run_megatune(train, 120);
  return out;
}

}  // namespace megatune::tests
