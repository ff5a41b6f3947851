// Megatron's tokenizer flags (--tokenizer-type, --vocab-file, --merge-file, --tokenizer-model and the
// TikTokenizer ones), shared by `megatune data preprocess` (which tokenizes with them) and `megatune train`
// (which takes the vocabulary size and the end-of-document id from them, as Megatron does).
#pragma once
#include <CLI/CLI.hpp>

#include "executor/data/tokenizer.h"

namespace megatune::tools {

// `with_ids` adds the preprocess-only "ids" type (the input already holds token ids).
void add_tokenizer_flags(CLI::App& command, executor::data::TokenizerFiles& files, bool with_ids);

}  // namespace megatune::tools
