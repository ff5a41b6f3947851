"""Parity of megatune's CUDA backend with PyTorch from the same weights.

Reads the directory written by `bench_train_gpu parity --out DIR` (index.txt, weights.bin, grads.bin,
tokens.bin), rebuilds the model in plain PyTorch (same parameter layout: QKV rows [q | k | v], SwiGLU fc1
rows [gate | up], rotate-half RoPE), computes the loss and every gradient in fp32 (the reference) and
with bf16 autocast (what a PyTorch user would run), and prints the relative errors of megatune and of torch
bf16 against the fp32 reference. Exit status 1 when megatune is outside the tolerance.
"""
import sys
import numpy as np
import torch
import torch.nn.functional as F


def load(directory):
    cfg, params, loss = {}, [], None
    for line in open(f"{directory}/index.txt"):
        parts = line.split()
        if parts[0] == "config":
            cfg["kind"] = parts[1]
            for i in range(2, len(parts), 2):
                cfg[parts[i]] = float(parts[i + 1]) if parts[i] == "eps" else int(parts[i + 1])
        elif parts[0] == "loss":
            loss = float(parts[1])
        elif parts[0] == "param":
            params.append((parts[1], int(parts[2]), int(parts[3]), int(parts[4])))
    weights = np.fromfile(f"{directory}/weights.bin", dtype=np.float32)
    grads = np.fromfile(f"{directory}/grads.bin", dtype=np.float32)
    n = cfg["mbs"] * cfg["seq"]
    ids = np.fromfile(f"{directory}/tokens.bin", dtype=np.int32)
    tokens, labels = ids[:n], ids[n:2 * n]

    def slices(flat):
        out = {}
        for name, rows, cols, offset in params:
            t = torch.from_numpy(flat[offset:offset + rows * cols].copy())
            out[name] = t.view(cols) if rows == 1 else t.view(rows, cols)
        return out

    return cfg, slices(weights), slices(grads), loss, tokens, labels


def rope(x, theta=10000.0):  # x (B, H, S, D)
    d = x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    angles = torch.arange(x.shape[2], device=x.device, dtype=torch.float32)[:, None] * inv_freq[None, :]
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x[..., : d // 2].float(), x[..., d // 2:].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def forward(cfg, W, tokens, labels):
    llama = cfg["kind"] == "llama"
    B, S, h = cfg["mbs"], cfg["seq"], cfg["hidden"]
    nh, nkv = cfg["heads"], cfg["kv_heads"]
    d = h // nh
    eps = cfg["eps"]

    def norm(x, prefix):
        if llama:
            return F.rms_norm(x, (h,), W[prefix + ".weight"], eps)
        return F.layer_norm(x, (h,), W[prefix + ".weight"], W[prefix + ".bias"], eps)

    def linear(x, prefix):
        return F.linear(x, W[prefix + ".weight"], W.get(prefix + ".bias"))

    x = W["embedding.word_embeddings.weight"][tokens].view(B, S, h)
    if not llama:
        x = x + W["embedding.position_embeddings.weight"][:S]
    for l in range(cfg["layers"]):
        p = f"decoder.layers.{l}."
        qkv = linear(norm(x, p + "input_layernorm"), p + "self_attention.linear_qkv")
        q, k, v = qkv.split([nh * d, nkv * d, nkv * d], -1)
        q = q.view(B, S, nh, d).transpose(1, 2)
        k = k.view(B, S, nkv, d).transpose(1, 2)
        v = v.view(B, S, nkv, d).transpose(1, 2)
        if llama:
            q, k = rope(q), rope(k)
        k = k.repeat_interleave(nh // nkv, dim=1)
        v = v.repeat_interleave(nh // nkv, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + linear(y.transpose(1, 2).reshape(B, S, nh * d), p + "self_attention.linear_proj")
        hidden = linear(norm(x, p + "pre_mlp_layernorm"), p + "mlp.linear_fc1")
        if llama:
            a, b = hidden.chunk(2, -1)
            hidden = F.silu(a) * b
        else:
            hidden = F.gelu(hidden, approximate="tanh")
        x = x + linear(hidden, p + "mlp.linear_fc2")
    logits = F.linear(norm(x, "decoder.final_layernorm"), W["output_layer.weight"])
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.view(-1))


def run(cfg, weights, tokens, labels, autocast):
    W = {k: v.cuda().requires_grad_(True) for k, v in weights.items()}
    t = torch.from_numpy(tokens.astype(np.int64)).cuda()
    y = torch.from_numpy(labels.astype(np.int64)).cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        loss = forward(cfg, W, t, y)
    loss.backward()
    return loss.item(), {k: v.grad.float().cpu() for k, v in W.items()}


def main():
    directory = sys.argv[1]
    cfg, weights, megatune_grads, megatune_loss, tokens, labels = load(directory)
    ref_loss, ref = run(cfg, weights, tokens, labels, autocast=False)
    bf_loss, bf = run(cfg, weights, tokens, labels, autocast=True)
    worst_mt, worst_bf, fails = 0.0, 0.0, []
    print(f"PARITY {cfg['kind']}: loss fp32 torch {ref_loss:.6f} | torch bf16 {bf_loss:.6f} | megatune {megatune_loss:.6f}")
    for name, g in ref.items():
        denom = g.norm().item() + 1e-12
        mt = (megatune_grads[name] - g).norm().item() / denom
        tb = (bf[name] - g).norm().item() / denom
        worst_mt, worst_bf = max(worst_mt, mt), max(worst_bf, tb)
        if mt > max(0.05, 3 * tb):
            fails.append(name)
        print(f"  {name:55s} rel.err megatune {mt:.2e}  torch-bf16 {tb:.2e}")
    loss_err = abs(megatune_loss - ref_loss) / ref_loss
    print(f"PARITY {cfg['kind']}: loss rel.err {loss_err:.2e}; worst grad rel.err megatune {worst_mt:.2e}, "
          f"torch bf16 {worst_bf:.2e}; {'PASS' if not fails and loss_err < 1e-2 else 'FAIL ' + ','.join(fails)}")
    return 0 if not fails and loss_err < 1e-2 else 1


if __name__ == "__main__":
    sys.exit(main())
