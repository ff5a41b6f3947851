"""Helpers of bench/hf_interchange_check.sh (Hugging Face interchange against transformers).

  make-data PREFIX            a Megatron indexed dataset (PREFIX.bin/.idx) of identical 32-token documents,
                              so that every sample megatune draws is the same 33 tokens, whatever its shuffle
  make-hf KIND SHAPE DIR      a random transformers model (KIND gpt2 | llama; SHAPE small: head dim 16, as
                              megatune's tiny preset; wide: head dim 64, which the CUDA kernels take), saved
                              as safetensors
  hf-loss DIR PREFIX          the mean next-token cross entropy of DIR's model on the sample, in fp32
  reference-loss DIR PREFIX   the same loss from a plain-Python forward pass of the HF folder (GPT-2 or
                              Llama or Mixtral as transformers defines them; no torch), in float64
"""
import json
import math
import random
import struct
import sys

SEQ = 32
VOCAB = 256
DOCUMENTS = 400


def document():
    rng = random.Random(11)
    return [rng.randrange(1, VOCAB) for _ in range(SEQ)]  # no 0: the byte tokenizer's EOD


def make_data(prefix):
    doc = document()
    with open(prefix + ".bin", "wb") as out:
        for _ in range(DOCUMENTS):
            out.write(struct.pack(f"<{SEQ}H", *doc))
    with open(prefix + ".idx", "wb") as out:
        out.write(b"MMIDIDX\x00\x00")
        out.write(struct.pack("<Q", 1))
        out.write(struct.pack("<B", 8))  # uint16
        out.write(struct.pack("<Q", DOCUMENTS))
        out.write(struct.pack("<Q", DOCUMENTS + 1))
        out.write(struct.pack(f"<{DOCUMENTS}i", *([SEQ] * DOCUMENTS)))
        out.write(struct.pack(f"<{DOCUMENTS}q", *[i * SEQ * 2 for i in range(DOCUMENTS)]))
        out.write(struct.pack(f"<{DOCUMENTS + 1}q", *range(DOCUMENTS + 1)))
    # Every sample: a document and the first token of the next (the same document).
    with open(prefix + ".sample.json", "w") as out:
        json.dump([int(t) for t in doc] + [int(doc[0])], out)


def make_hf(kind, shape, directory):
    import torch
    import transformers

    torch.manual_seed(5)
    wide = shape == "wide"
    if kind == "gpt2":
        config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=128 if wide else 64, n_layer=2,
                                         n_head=2 if wide else 4, activation_function="gelu_new",
                                         tie_word_embeddings=True, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    else:  # grouped-query attention: 4 heads on 2 key/value heads
        config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=128 if wide else 64,
                                          intermediate_size=256 if wide else 128, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, head_dim=64 if wide else 16,
                                          max_position_embeddings=SEQ, rms_norm_eps=1e-5, tie_word_embeddings=False)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # far from the initialization, so that a wrong mapping shows in the loss
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(directory)  # safetensors, transformers' default


def hf_loss(directory, prefix):
    import torch
    import transformers

    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    except TypeError:
        model = transformers.AutoModelForCausalLM.from_pretrained(directory, torch_dtype=torch.float32)
    model.eval()
    with open(prefix + ".sample.json") as f:
        sample = torch.tensor(json.load(f), dtype=torch.long)
    with torch.no_grad():
        logits = model(sample[None, :-1]).logits[0].float()
        loss = torch.nn.functional.cross_entropy(logits, sample[1:])
    print(f"{loss.item():.9g}")


def read_safetensors(directory):
    import os

    tensors = {}
    names = [n for n in os.listdir(directory) if n.endswith(".safetensors")]
    for name in names:
        with open(os.path.join(directory, name), "rb") as f:
            length = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(length))
            data = f.read()
        for key, entry in header.items():
            if key == "__metadata__":
                continue
            begin, end = entry["data_offsets"]
            assert entry["dtype"] == "F32", "reference-loss reads fp32 exports"
            values = list(struct.unpack(f"<{(end - begin) // 4}f", data[begin:end]))
            shape = entry["shape"]
            if len(shape) == 2:
                values = [values[r * shape[1]:(r + 1) * shape[1]] for r in range(shape[0])]
            tensors[key] = values
    return tensors


def matmul_t(x, w):  # x (T, in) times w^T, w (out, in) as torch.nn.Linear stores it
    return [[sum(a * b for a, b in zip(row, col)) for col in w] for row in x]


def matmul(x, w):  # x (T, in) times w (in, out), as GPT-2's Conv1D stores it
    return matmul_t(x, [list(c) for c in zip(*w)])


def add_bias(x, b):
    return [[v + c for v, c in zip(row, b)] for row in x]


def layer_norm(x, w, b, eps):
    out = []
    for row in x:
        mean = sum(row) / len(row)
        var = sum((v - mean) ** 2 for v in row) / len(row)
        out.append([(v - mean) / math.sqrt(var + eps) * g + c for v, g, c in zip(row, w, b)])
    return out


def rms_norm(x, w, eps):
    return [[v / math.sqrt(sum(u * u for u in row) / len(row) + eps) * g for v, g in zip(row, w)] for row in x]


def attention(q, k, v, heads, kv_heads, d):  # causal; q (T, heads*d), k and v (T, kv_heads*d)
    t = len(q)
    out = [[0.0] * (heads * d) for _ in range(t)]
    for h in range(heads):
        g = h // (heads // kv_heads)
        for i in range(t):
            qi = q[i][h * d:(h + 1) * d]
            scores = [sum(a * b for a, b in zip(qi, k[j][g * d:(g + 1) * d])) / math.sqrt(d) for j in range(i + 1)]
            top = max(scores)
            weights = [math.exp(s - top) for s in scores]
            total = sum(weights)
            for j, w in enumerate(weights):
                for c in range(d):
                    out[i][h * d + c] += w / total * v[j][g * d + c]
    return out


def rope(x, heads, d, theta):  # rotate-half, as transformers' Llama
    half = d // 2
    out = [row[:] for row in x]
    for pos, row in enumerate(out):
        for h in range(heads):
            for i in range(half):
                angle = pos / theta ** (2 * i / d)
                a, b = row[h * d + i], row[h * d + i + half]
                row[h * d + i] = a * math.cos(angle) - b * math.sin(angle)
                row[h * d + i + half] = b * math.cos(angle) + a * math.sin(angle)
    return out


def gelu_new(v):
    return 0.5 * v * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v ** 3)))


def gpt2_logits(c, w, ids):
    p = "transformer." if "transformer.wte.weight" in w else ""
    heads, eps = c["n_head"], c.get("layer_norm_epsilon", 1e-5)
    x = [[a + b for a, b in zip(w[p + "wte.weight"][t], w[p + "wpe.weight"][i])] for i, t in enumerate(ids)]
    for l in range(c["n_layer"]):
        q = f"{p}h.{l}."
        a = layer_norm(x, w[q + "ln_1.weight"], w[q + "ln_1.bias"], eps)
        qkv = add_bias(matmul(a, w[q + "attn.c_attn.weight"]), w[q + "attn.c_attn.bias"])
        h = len(x[0])
        o = attention([r[:h] for r in qkv], [r[h:2 * h] for r in qkv], [r[2 * h:] for r in qkv], heads, heads,
                      h // heads)
        o = add_bias(matmul(o, w[q + "attn.c_proj.weight"]), w[q + "attn.c_proj.bias"])
        x = [[u + v for u, v in zip(r, s)] for r, s in zip(x, o)]
        m = layer_norm(x, w[q + "ln_2.weight"], w[q + "ln_2.bias"], eps)
        f = [[gelu_new(v) for v in r] for r in add_bias(matmul(m, w[q + "mlp.c_fc.weight"]), w[q + "mlp.c_fc.bias"])]
        f = add_bias(matmul(f, w[q + "mlp.c_proj.weight"]), w[q + "mlp.c_proj.bias"])
        x = [[u + v for u, v in zip(r, s)] for r, s in zip(x, f)]
    x = layer_norm(x, w[p + "ln_f.weight"], w[p + "ln_f.bias"], eps)
    return matmul_t(x, w.get("lm_head.weight", w[p + "wte.weight"]))


def swiglu(m, w, gate_name, up_name, down_name):
    gate, up = matmul_t(m, w[gate_name]), matmul_t(m, w[up_name])
    f = [[g / (1 + math.exp(-g)) * u for g, u in zip(rg, ru)] for rg, ru in zip(gate, up)]
    return matmul_t(f, w[down_name])


def mixtral_moe(c, w, prefix, m):  # softmax over the experts, the top k renormalized, as transformers' Mixtral
    k = c["num_experts_per_tok"]
    out = []
    for row, logits in zip(m, matmul_t(m, w[prefix + "gate.weight"])):
        top = max(logits)
        probs = [math.exp(v - top) for v in logits]
        chosen = sorted(range(len(probs)), key=lambda e: -probs[e])[:k]
        total = sum(probs[e] for e in chosen)
        acc = [0.0] * len(row)
        for e in chosen:
            e_prefix = f"{prefix}experts.{e}."
            y = swiglu([row], w, e_prefix + "w1.weight", e_prefix + "w3.weight", e_prefix + "w2.weight")[0]
            acc = [a + probs[e] / total * v for a, v in zip(acc, y)]
        out.append(acc)
    return out


def llama_logits(c, w, ids):
    heads, kv, eps = c["num_attention_heads"], c["num_key_value_heads"], c["rms_norm_eps"]
    d = c.get("head_dim") or c["hidden_size"] // heads
    theta = c.get("rope_parameters", {}).get("rope_theta", c.get("rope_theta", 10000.0))
    x = [list(w["model.embed_tokens.weight"][t]) for t in ids]
    for l in range(c["num_hidden_layers"]):
        q = f"model.layers.{l}."
        a = rms_norm(x, w[q + "input_layernorm.weight"], eps)
        qs = rope(matmul_t(a, w[q + "self_attn.q_proj.weight"]), heads, d, theta)
        ks = rope(matmul_t(a, w[q + "self_attn.k_proj.weight"]), kv, d, theta)
        vs = matmul_t(a, w[q + "self_attn.v_proj.weight"])
        o = matmul_t(attention(qs, ks, vs, heads, kv, d), w[q + "self_attn.o_proj.weight"])
        x = [[u + v for u, v in zip(r, s)] for r, s in zip(x, o)]
        m = rms_norm(x, w[q + "post_attention_layernorm.weight"], eps)
        f = mixtral_moe(c, w, q + "block_sparse_moe.", m) if "num_local_experts" in c else \
            swiglu(m, w, q + "mlp.gate_proj.weight", q + "mlp.up_proj.weight", q + "mlp.down_proj.weight")
        x = [[u + v for u, v in zip(r, s)] for r, s in zip(x, f)]
    x = rms_norm(x, w["model.norm.weight"], eps)
    return matmul_t(x, w.get("lm_head.weight", w["model.embed_tokens.weight"]))


def reference_loss(directory, prefix):
    import os

    with open(os.path.join(directory, "config.json")) as f:
        config = json.load(f)
    with open(prefix + ".sample.json") as f:
        sample = json.load(f)
    weights = read_safetensors(directory)
    forward = gpt2_logits if config["model_type"] == "gpt2" else llama_logits
    logits = forward(config, weights, sample[:-1])
    total = 0.0
    for row, target in zip(logits, sample[1:]):
        top = max(row)
        total += top + math.log(sum(math.exp(v - top) for v in row)) - row[target]
    print(f"{total / len(logits):.9g}")


def main():
    command = sys.argv[1]
    if command == "make-data":
        make_data(sys.argv[2])
    elif command == "make-hf":
        make_hf(sys.argv[2], sys.argv[3], sys.argv[4])
    elif command == "hf-loss":
        hf_loss(sys.argv[2], sys.argv[3])
    elif command == "reference-loss":
        reference_loss(sys.argv[2], sys.argv[3])
    else:
        sys.exit(f"unknown command {command}")


if __name__ == "__main__":
    main()
