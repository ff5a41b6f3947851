// SentencePieceTokenizer (Megatron's _SentencePieceTokenizer for preprocessing): a SentencePiece model's
// ids of the text, EOD = the model's </s> (eos) id. Built only with libsentencepiece.
#pragma once
#include <memory>
#include <string>

#include "executor/data/tokenizer.h"

namespace megatune::executor::data {

bool sentencepiece_available();
// UserError naming --tokenizer-model for a missing or unloadable model, or when this build has no
// SentencePiece (naming the package to install).
std::unique_ptr<TextTokenizer> make_sentencepiece_tokenizer(const std::string& model_file);
// Megatron's Llama2Tokenizer: the model's pieces (no added specials), EOD = eos, bos before each document.
std::unique_ptr<TextTokenizer> make_llama2_tokenizer(const std::string& model_file);

}  // namespace megatune::executor::data
