#!/usr/bin/env python3
"""Builds a byte-level corpus of real English text from documentation installed on this machine (no network):
GNU info manuals (one document per info node), /usr/share/common-licenses, and English manual pages of
sections 1, 5, 7 and 8 rendered to plain ASCII with groff (without the Google Cloud SDK's ~16,000 generated
gcloud pages, which would be most of it). Writes OUT/corpus.jsonl (one JSON document a line) and
OUT/SOURCES.txt (what went in), runs `megatune data preprocess --append-eod` (byte tokenizer: token = byte,
EOD 256) into OUT/text_text_document.{bin,idx}, then deletes the JSONL (--keep-jsonl keeps it) so OUT is
small enough to carry to the GPU machine. Deterministic for a given machine: sorted inputs, manual pages
taken in the order of a hash of their names until the size budget is reached.

usage: bench/peer/make_text_corpus.py --megatune build/bin/megatune [--out .corpus] [--max-mb 12]
"""
import argparse
import glob
import gzip
import hashlib
import json
import os
import re
import subprocess
import sys


def read_maybe_gz(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        return f.read()


def clean(text):
    """Plain printable text: tabs kept, form feeds and other controls dropped, runs of blank lines folded."""
    text = text.replace("\r\n", "\n")
    text = re.sub(r"[\x00-\x08\x0b-\x1f\x7f]", "", text)
    text = re.sub(r"[ \t]+\n", "\n", text)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip() + "\n"


def info_documents():
    """GNU info manuals: every node (text between 0x1f separators) is one document."""
    docs = []
    for path in sorted(glob.glob("/usr/share/info/*.info*")):
        if not re.search(r"\.info(-\d+)?(\.gz)?$", path):
            continue
        raw = read_maybe_gz(path).decode("utf-8", errors="replace")
        for node in raw.split("\x1f"):
            if node.lstrip().startswith(("Tag Table:", "Indirect:", "End Tag Table")):
                continue
            node = clean(node)
            if len(node) >= 200:
                docs.append((os.path.basename(path), node))
    return docs


def license_documents():
    docs = []
    for path in sorted(glob.glob("/usr/share/common-licenses/*")):
        if os.path.isfile(path):
            docs.append((os.path.basename(path), clean(read_maybe_gz(path).decode("utf-8", errors="replace"))))
    return docs


def render_man(path):
    """One manual page as plain ASCII (groff, tbl; no overstriking or escape sequences); None if unusable."""
    source = read_maybe_gz(path)
    if len(source) < 600 or source.lstrip().startswith(b".so "):  # stubs and redirects to another page
        return None
    try:
        result = subprocess.run(["groff", "-t", "-mandoc", "-Tascii", "-P-cbou", "-rLL=78n"], input=source,
                                capture_output=True, timeout=20)
    except subprocess.TimeoutExpired:
        return None
    if result.returncode != 0:
        return None
    text = clean(result.stdout.decode("ascii", errors="ignore"))
    return text if len(text) >= 400 else None


def man_documents(budget_bytes):
    pages = []
    for section in ("1", "5", "7", "8"):
        pages += [p for p in sorted(glob.glob(f"/usr/share/man/man{section}/*"))
                  if not os.path.basename(p).startswith(("gcloud", "bq.", "gsutil."))]
    pages.sort(key=lambda p: hashlib.sha256(p.encode()).hexdigest())  # a spread of names, not a-z
    docs, total = [], 0
    for path in pages:
        if total >= budget_bytes:
            break
        text = render_man(path)
        if text is not None:
            docs.append((os.path.basename(path), text))
            total += len(text)
    return docs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megatune", required=True, help="the megatune executable (for data preprocess)")
    parser.add_argument("--out", default=".corpus", help="output folder (default .corpus, git-ignored)")
    parser.add_argument("--max-mb", type=float, default=12.0, help="size budget of the corpus in MB")
    parser.add_argument("--keep-jsonl", action="store_true", help="keep OUT/corpus.jsonl after preprocessing")
    args = parser.parse_args()
    if not os.access(args.megatune, os.X_OK):
        sys.exit(f"--megatune {args.megatune}: not an executable; build it first (cmake --build ... --target megatune)")
    budget = int(args.max_mb * 1e6)
    os.makedirs(args.out, exist_ok=True)

    sources = [("info manuals", info_documents()), ("common licenses", license_documents())]
    fixed = sum(len(text) for _, docs in sources for _, text in docs)
    sources.append(("manual pages (sections 1, 5, 7, 8)", man_documents(max(0, budget - fixed))))

    seen = set()
    jsonl = os.path.join(args.out, "corpus.jsonl")
    summary = []
    with open(jsonl, "w", encoding="utf-8") as out:
        for name, docs in sources:
            count = size = 0
            for origin, text in docs:
                digest = hashlib.sha256(text.encode()).digest()
                if digest in seen:
                    continue
                seen.add(digest)
                out.write(json.dumps({"text": text, "source": origin}) + "\n")
                count += 1
                size += len(text.encode())
            summary.append(f"{name}: {count} documents, {size / 1e6:.2f} MB")
    with open(os.path.join(args.out, "SOURCES.txt"), "w") as f:
        f.write("Byte-level corpus built by bench/peer/make_text_corpus.py from this machine's documentation.\n")
        f.write("\n".join(summary) + "\n")
    print("\n".join(summary))

    prefix = os.path.join(args.out, "text")
    subprocess.run([args.megatune, "data", "preprocess", "--input", jsonl, "--output-prefix", prefix,
                    "--json-keys", "text", "--tokenizer-type", "byte", "--append-eod", "--overwrite",
                    "--log-interval", "1000000"], check=True)
    subprocess.run([args.megatune, "data", "info", prefix + "_text_document"], check=True)
    if not args.keep_jsonl:
        os.remove(jsonl)
    print(f"--data-path {prefix}_text_document")


if __name__ == "__main__":
    main()
