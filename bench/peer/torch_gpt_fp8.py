"""FP8 peer: bench/peer/torch_gpt.py's model with the transformer layers' linears (qkv, proj, fc1, fc2) in FP8
through torch._scaled_mm, compiled; the LM head, norms and attention stay bf16 as in megatune and Megatron.
The device has torch but neither Transformer Engine nor torchao, so the FP8 linear is written here in the
shape torchao's Float8Linear takes:
  --recipe tensorwise: current scaling, one scale per tensor from its amax; E4M3 activations and weights,
                       gradients E5M2 (--format hybrid, the default) or E4M3 (--format e4m3);
  --recipe rowwise:    one scale per row of each GEMM operand (along the reduction dimension), E4M3 throughout.
Forward, input-gradient and weight-gradient GEMMs are all FP8 (fast accumulation in the forward only, as
torchao); every cast reads the bf16 tensor (torch.compile fuses each amax and cast). Before timing, the FP8
linear is checked against the bf16 one on random data (relative error bound 0.08 for the output and both
gradients: E4M3 has 3 mantissa bits, E5M2 2). Prints one ANCHOR line like torch_gpt.py."""
import argparse, sys, time
import torch, torch.nn as nn, torch.nn.functional as F

sys.path.insert(0, __import__("os").path.dirname(__file__))
import torch_gpt as base  # noqa: E402

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
# Llama 3 8B cut to 16 layers (one H200 holds it with AdamW state): layers, hidden, heads, kv heads, ffn,
# vocab, seq, swiglu, as torch_gpt.CONFIGS.
base.CONFIGS.setdefault("llama3-8b-16l", (16, 4096, 32, 8, 14336, 128256, 4096, True))


def cast(t, dtype, dim):
    """t as dtype with its dequantisation scale: one for the tensor (dim None) or one per slice along dim."""
    amax = t.abs().amax() if dim is None else t.abs().amax(dim=dim, keepdim=True)
    scale = amax.float().clamp(min=1e-12) / torch.finfo(dtype).max
    return (t.float() / scale).to(dtype), scale


def scaled_mm(a, b_t, rowwise, grad_dtype_a, fast):
    """a (M, K) @ b_t.T where b_t is (N, K): both operands reduced along K, as _scaled_mm wants them
    (mat2 column-major is the transpose of a row-major (N, K) tensor)."""
    a8, sa = cast(a, grad_dtype_a, 1 if rowwise else None)
    b8, sb = cast(b_t, E4M3, 1 if rowwise else None)
    return torch._scaled_mm(a8, b8.t(), scale_a=sa, scale_b=sb.t() if rowwise else sb,
                            out_dtype=torch.bfloat16, use_fast_accum=fast)


class Fp8Matmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, rowwise, grad_dtype):
        ctx.save_for_backward(x, w)
        ctx.rowwise, ctx.grad_dtype = rowwise, grad_dtype
        return scaled_mm(x, w, rowwise, E4M3, True)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        g = g.contiguous()
        # dgrad: g (M, N) @ w (N, K), reduced along N: the second operand is w^T (K, N) reduced along N.
        dx = scaled_mm(g, w.t().contiguous(), ctx.rowwise, ctx.grad_dtype, False)
        # wgrad: g^T (N, M) @ x (M, K), reduced along M.
        dw = scaled_mm(g.t().contiguous(), x.t().contiguous(), ctx.rowwise, ctx.grad_dtype, False)
        return dx, dw, None, None


class Fp8Linear(nn.Module):
    def __init__(s, linear, rowwise, grad_dtype):
        super().__init__()
        s.weight, s.bias = linear.weight, linear.bias
        s.rowwise, s.grad_dtype = rowwise, grad_dtype

    def forward(s, x):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).to(torch.bfloat16)
        y = Fp8Matmul.apply(x2, s.weight.to(torch.bfloat16), s.rowwise, s.grad_dtype)
        if s.bias is not None:
            y = y + s.bias.to(torch.bfloat16)
        return y.view(*shape[:-1], y.shape[-1])


def to_fp8(model, rowwise, grad_dtype):
    for b in model.blocks:
        for name in ("qkv", "o", "fc1", "fc2"):
            setattr(b, name, Fp8Linear(getattr(b, name), rowwise, grad_dtype))


def check_linear(rowwise, grad_dtype):
    """The FP8 linear against the bf16 one: output and both gradients within 0.08 relative (Frobenius)."""
    torch.manual_seed(1)
    lin = nn.Linear(1024, 768, bias=True).cuda()
    x = torch.randn(512, 1024, device="cuda", requires_grad=True)
    g = torch.randn(512, 768, device="cuda")
    errs = []
    ref_out = F.linear(x.bfloat16(), lin.weight.bfloat16(), lin.bias.bfloat16())
    ref_out.backward(g.bfloat16())
    ref = [ref_out.float(), x.grad.clone(), lin.weight.grad.clone()]
    x.grad = None; lin.weight.grad = None
    out = Fp8Linear(lin, rowwise, grad_dtype)(x)
    out.backward(g.bfloat16())
    for name, a, r in zip(("output", "input grad", "weight grad"), [out.float(), x.grad, lin.weight.grad], ref):
        err = ((a.float() - r.float()).norm() / r.float().norm()).item()
        errs.append(f"{name} {err:.4f}")
        if not err < 0.08:
            sys.exit(f"FP8 linear check failed: {name} relative error {err:.4f} (bound 0.08)")
    return ", ".join(errs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt-1.3b"); ap.add_argument("--mbs", type=int, default=4)
    ap.add_argument("--steps", type=int, default=12); ap.add_argument("--seq", type=int, default=0)
    ap.add_argument("--recipe", choices=["tensorwise", "rowwise", "none"], default="tensorwise",
                    help="none: the same model in bf16 (the baseline of a shape torch_gpt.py lacks)")
    ap.add_argument("--format", choices=["hybrid", "e4m3"], default="hybrid")
    ap.add_argument("--no-compile", action="store_true")
    a = ap.parse_args()
    rowwise = a.recipe == "rowwise"
    grad_dtype = E5M2 if (a.format == "hybrid" and not rowwise) else E4M3
    if a.recipe != "none":
        print(f"FP8 linear check ({a.recipe}, grads {grad_dtype}): {check_linear(rowwise, grad_dtype)}", flush=True)
    L, h, nh, nkv, ffn, V, T, sw = base.CONFIGS[a.model]
    if a.seq: T = a.seq
    torch.manual_seed(0)
    m = base.GPT(L, h, nh, nkv, ffn, V, T, sw).cuda()
    if a.recipe != "none":
        to_fp8(m, rowwise, grad_dtype)
    nparams = sum(p.numel() for p in m.parameters())
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True)
    fwd = m if a.no_compile else torch.compile(m)
    x = torch.randint(0, V, (a.mbs, T), device="cuda"); y = torch.randint(0, V, (a.mbs, T), device="cuda")
    times, losses = [], []
    for _ in range(a.steps):
        torch.cuda.synchronize(); t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(x, y)
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize(); times.append(time.perf_counter() - t0); losses.append(loss.item())
    st = sorted(times[3:])[len(times[3:]) // 2]
    fpt_causal, _ = base.model_flops_per_token(L, h, nh, nkv, ffn, V, T, sw)
    tok = a.mbs * T
    print(f"ANCHOR torch-fp8 model={a.model} recipe={a.recipe} grads={a.format if not rowwise else 'e4m3'} "
          f"params={nparams/1e9:.2f}B seq={T} mbs={a.mbs} compile={not a.no_compile} step={st*1e3:.1f}ms "
          f"tok/s/gpu={tok/st:.0f} MFU(causal-half)={fpt_causal*tok/st/base.PEAK*100:.1f}% "
          f"mem={torch.cuda.max_memory_allocated()/2**30:.2f}GiB loss {losses[0]:.3f} -> {losses[-1]:.3f}", flush=True)


if __name__ == "__main__":
    main()
