"""MoE peer: a plain PyTorch Mixtral-style trainer on megatune's mixtral-small shape (layouts/model_presets.cpp),
timed on the device beside bench_train_gpu perf --model mixtral-small.

Model (as megatune's): token embedding, L blocks of [RMSNorm, QKV (GQA, no bias), RoPE (rotate-half, theta
1e4), causal SDPA, output projection, residual; RMSNorm, router (h -> E, no bias), softmax over the top-k
logits (Megatron's default, not pre-softmax) with the switch aux loss (coeff 1e-2), dropless top-k experts
(SwiGLU, fc1 h -> 2 ffn, fc2 ffn -> h), probability-weighted combine, residual], final RMSNorm, untied head,
cross entropy. bf16 autocast over fp32 parameters, fused AdamW.

The experts have static shapes: the T*k (token, choice) pairs are sorted by expert (stable argsort), gathered,
run through torch._grouped_mm with offsets = cumsum of the per-expert counts (int32), and combined by the
inverse permutation, so torch.compile sees no data-dependent shape. --align 16 pads each expert's rows to a
multiple of 16 (a static upper bound of T*k + 16E rows) for builds whose grouped GEMM needs aligned groups;
the start-up check picks it when unaligned groups fail or disagree with a per-expert loop.
--compile regional compiles each block and the head/loss separately (one compiled graph shared by the
identical blocks); full compiles the whole model (fullgraph=True)."""
import argparse, math, time
import torch, torch.nn as nn, torch.nn.functional as F

PEAK = 989.4e12  # H100/H200 SXM dense bf16 datasheet

# name: layers, hidden, heads, kv_heads, experts, topk, moe_ffn, vocab, seq (layouts::model_preset)
CONFIGS = {"mixtral-small": (8, 2048, 16, 8, 8, 2, 4096, 32000, 2048)}


def rotate_half(x):
    a, b = x.chunk(2, -1)
    return torch.cat((-b, a), -1)


def expert_mlp(x_perm, counts, w1, w2, align):
    """x_perm (R, h) sorted by expert, counts (E,) int; w1 (E, 2f, h), w2 (E, h, f) -> (R, h)."""
    R = x_perm.shape[0]
    E = counts.shape[0]
    w1t = w1.to(torch.bfloat16).transpose(-2, -1)  # (E, h, 2f)
    w2t = w2.to(torch.bfloat16).transpose(-2, -1)  # (E, f, h)
    x_perm = x_perm.to(torch.bfloat16)
    if align <= 1:
        offs = torch.cumsum(counts, 0).to(torch.int32)
        a, b = torch._grouped_mm(x_perm, w1t, offs=offs).chunk(2, -1)
        return torch._grouped_mm(F.silu(a) * b, w2t, offs=offs)
    # Padded groups: row i of expert e goes to padded_start[e] + (i - start[e]); static size P.
    padded = (counts + align - 1) // align * align
    end, padded_end = torch.cumsum(counts, 0), torch.cumsum(padded, 0)
    start, padded_start = end - counts, padded_end - padded
    expert_of_row = torch.repeat_interleave(torch.arange(E, device=x_perm.device), counts, output_size=R)
    pos = padded_start[expert_of_row] + torch.arange(R, device=x_perm.device) - start[expert_of_row]
    P = (R + E * (align - 1) + align - 1) // align * align
    x_pad = x_perm.new_zeros(P, x_perm.shape[1]).index_copy(0, pos, x_perm)
    offs = padded_end.to(torch.int32)
    a, b = torch._grouped_mm(x_pad, w1t, offs=offs).chunk(2, -1)
    return torch._grouped_mm(F.silu(a) * b, w2t, offs=offs).index_select(0, pos)


class Block(nn.Module):
    def __init__(s, h, nh, nkv, E, k, ffn, align, aux_coeff):
        super().__init__()
        s.nh, s.nkv, s.hd, s.E, s.k, s.align, s.aux_coeff = nh, nkv, h // nh, E, k, align, aux_coeff
        s.n1, s.n2 = nn.RMSNorm(h), nn.RMSNorm(h)
        s.qkv = nn.Linear(h, (nh + 2 * nkv) * s.hd, bias=False)
        s.o = nn.Linear(h, h, bias=False)
        s.router = nn.Linear(h, E, bias=False)
        s.w1 = nn.Parameter(torch.randn(E, 2 * ffn, h) * 0.02)
        s.w2 = nn.Parameter(torch.randn(E, h, ffn) * 0.02)

    def forward(s, x, cos, sin):
        B, T, C = x.shape
        q, k, v = s.qkv(s.n1(x)).split([s.nh * s.hd, s.nkv * s.hd, s.nkv * s.hd], -1)
        q = q.view(B, T, s.nh, s.hd).transpose(1, 2)
        k = k.view(B, T, s.nkv, s.hd).transpose(1, 2)
        v = v.view(B, T, s.nkv, s.hd).transpose(1, 2)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)  # bf16 under autocast, as megatune's RoPE
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=(s.nkv != s.nh))
        x = x + s.o(y.transpose(1, 2).reshape(B, T, C))
        hn = s.n2(x).view(B * T, C)
        logits = s.router(hn).float()  # (N, E)
        top_logits, top_e = logits.topk(s.k, -1)  # (N, k)
        probs = torch.softmax(top_logits, -1)
        N = B * T
        flat_e = top_e.reshape(-1)
        counts = torch.zeros(s.E, dtype=torch.int64, device=x.device).scatter_add_(
            0, flat_e, torch.ones_like(flat_e))
        # Switch aux loss (Megatron's): E * coeff * sum_e(mean softmax prob_e * tokens_e) / (N * k)
        scores = torch.softmax(logits, -1)
        aux = s.aux_coeff * s.E * (scores.sum(0) * counts.float()).sum() / (N * N * s.k)
        order = torch.argsort(flat_e, stable=True)  # pairs sorted by expert, tokens in order
        y_perm = expert_mlp(hn.index_select(0, order // s.k), counts, s.w1, s.w2, s.align)
        inverse = torch.empty_like(order).scatter_(0, order, torch.arange(N * s.k, device=x.device))
        y_pairs = y_perm.index_select(0, inverse).view(N, s.k, C)
        moe = (y_pairs.float() * probs.unsqueeze(-1)).sum(1).to(x.dtype)
        return x + moe.view(B, T, C), aux


class Head(nn.Module):
    def __init__(s, h, V):
        super().__init__()
        s.nf, s.head = nn.RMSNorm(h), nn.Linear(h, V, bias=False)

    def forward(s, x, tgt):
        return F.cross_entropy(s.head(s.nf(x)).float().view(-1, s.head.out_features), tgt.view(-1))


class MoEModel(nn.Module):
    def __init__(s, L, h, nh, nkv, E, k, ffn, V, T, align, aux_coeff=1e-2):
        super().__init__()
        s.emb = nn.Embedding(V, h)
        s.blocks = nn.ModuleList([Block(h, nh, nkv, E, k, ffn, align, aux_coeff) for _ in range(L)])
        s.out = Head(h, V)
        hd = h // nh
        inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2).float() / hd))
        ang = torch.outer(torch.arange(T).float(), inv)
        ang = torch.cat((ang, ang), -1)
        s.register_buffer("cos", ang.cos()[None, None], persistent=False)
        s.register_buffer("sin", ang.sin()[None, None], persistent=False)
        s.block_fns = list(s.blocks)
        s.head_fn = s.out

    def forward(s, idx, tgt):
        x = s.emb(idx)
        aux = 0.0
        for b in s.block_fns:
            x, a = b(x, s.cos, s.sin)
            aux = aux + a
        return s.head_fn(x, tgt) + aux


def grouped_mm_check(align):
    """torch._grouped_mm (fwd + bwd) on uneven groups (one empty) against a per-expert loop."""
    torch.manual_seed(1)
    E, h, f = 4, 256, 128
    counts = torch.tensor([37, 0, 91, 128], device="cuda")
    R = int(counts.sum())
    x = torch.randn(R, h, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w1 = torch.randn(E, 2 * f, h, device="cuda", requires_grad=True)
    w2 = torch.randn(E, h, f, device="cuda", requires_grad=True)
    y = expert_mlp(x, counts, w1, w2, align)
    y.float().square().sum().backward()
    got = (y.float(), x.grad.float(), w1.grad.clone())
    x.grad = w1.grad = w2.grad = None
    outs, first = [], 0
    for e, n in enumerate(counts.tolist()):
        xe = x[first:first + n]
        a, b = (xe @ w1[e].to(torch.bfloat16).t()).chunk(2, -1)
        outs.append((F.silu(a) * b) @ w2[e].to(torch.bfloat16).t())
        first += n
    ref = torch.cat(outs)
    ref.float().square().sum().backward()
    want = (ref.float(), x.grad.float(), w1.grad)
    return max(((g - w).abs().max() / (w.abs().max() + 1e-6)).item() for g, w in zip(got, want))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mixtral-small"); ap.add_argument("--mbs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=16); ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--compile", choices=["none", "regional", "full"], default="regional")
    ap.add_argument("--align", type=int, default=0, help="0: pick by the start-up check; 1: none; 16")
    a = ap.parse_args()
    L, h, nh, nkv, E, k, ffn, V, T = CONFIGS[a.model]
    torch.cuda.set_device(0); dev = "cuda"
    align = a.align
    if align == 0:
        try:
            err = grouped_mm_check(1)
        except Exception as exc:  # unaligned groups refused by this build
            err = float("inf"); print(f"grouped_mm unaligned groups failed: {type(exc).__name__}: {exc}")
        align = 1 if err < 5e-2 else 16
        print(f"grouped_mm check (unaligned groups): max rel err {err:.2e} -> align {align}")
    if align > 1:
        print(f"grouped_mm check (align {align}): max rel err {grouped_mm_check(align):.2e}")
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    with torch.device(dev):  # initialized on the device
        m = MoEModel(L, h, nh, nkv, E, k, ffn, V, T, align)
    nparams = sum(p.numel() for p in m.parameters())
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True)
    fwd = m
    if a.compile == "full":
        fwd = torch.compile(m, fullgraph=True)
    elif a.compile == "regional":
        m.block_fns = [torch.compile(b, fullgraph=True) for b in m.blocks]
        m.head_fn = torch.compile(m.out, fullgraph=True)
    x = torch.randint(0, V, (a.mbs, T), device=dev); y = torch.randint(0, V, (a.mbs, T), device=dev)
    times = []
    t_start = time.perf_counter()
    for i in range(a.steps):
        torch.cuda.synchronize(); t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(x, y)
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize(); times.append(time.perf_counter() - t0)
        if i == 0: print(f"first step (compile included) {times[0]:.1f}s", flush=True)
    st = sorted(times[a.warmup:])[len(times[a.warmup:]) // 2]
    # Megatron's formula as layouts::model_flops_per_iteration (routed top-k experts only, causal attention
    # halved, router not counted): per token 6h(3 f k)L + 6(h(q+2kv)+qh)L + 6 q s L + 6 h V.
    q, kv = h, (h // nh) * nkv
    fpt = 6 * h * 3 * ffn * k * L + 6 * (h * (q + 2 * kv) + q * h) * L + 6 * q * T * L + 6 * h * V
    tok = a.mbs * T
    print(f"ANCHOR torch-moe model={a.model} params={nparams/1e9:.2f}B seq={T} mbs={a.mbs} compile={a.compile} "
          f"align={align} step={st*1e3:.1f}ms tok/s={tok/st:.0f} MFU={fpt*tok/st/PEAK*100:.1f}% "
          f"mem={torch.cuda.max_memory_allocated()/2**30:.2f}GiB loss={loss.item():.3f} "
          f"steps={a.steps} total={time.perf_counter()-t_start:.0f}s", flush=True)


if __name__ == "__main__":
    main()
