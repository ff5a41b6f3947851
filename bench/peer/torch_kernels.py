"""Kernel-time breakdown of the PyTorch peer's training step (torch_gpt.py's model, same flags), from the
torch profiler: device time per kernel category (GEMM, attention, optimizer, fused elementwise, other) and
the longest kernels, for comparison with `bench_train_gpu perf`'s per-op shares of megatune's step."""
import argparse, os, sys, collections
import torch
from torch.profiler import profile, ProfilerActivity

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_gpt  # noqa: E402


def category(name):
    n = name.lower()
    if "nvjet" in n or "gemm" in n or "xmma" in n or "cutlass" in n or "splitk" in n:
        return "gemm"
    if "flash" in n or "fmha" in n or "attention" in n or "sdpa" in n or n.startswith("void cudnn::"):
        return "attention"
    if "adam" in n or "multi_tensor" in n:
        return "optimizer"
    if n.startswith("triton") or "triton" in n:
        return "fused elementwise (triton)"
    return "other"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt-1.3b"); ap.add_argument("--mbs", type=int, default=4)
    ap.add_argument("--compile", action="store_true"); ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    L, h, nh, nkv, ffn, V, T, sw = torch_gpt.CONFIGS[a.model]
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    m = torch_gpt.GPT(L, h, nh, nkv, ffn, V, T, sw).cuda()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True)
    fwd = torch.compile(m) if a.compile else m
    x = torch.randint(0, V, (a.mbs, T), device="cuda"); y = torch.randint(0, V, (a.mbs, T), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(x, y)
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)

    for _ in range(4):
        step()
    torch.cuda.synchronize()
    steps = 2
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    per_kernel = collections.defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        name = e.name
        if name.startswith("Memcpy") or name.startswith("Memset"):
            cat_name = name.split()[0]
        else:
            cat_name = name
        us = e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
        per_kernel[cat_name][0] += us / 1e3 / steps
        per_kernel[cat_name][1] += 1
    cats = collections.defaultdict(float)
    for name, (ms, _) in per_kernel.items():
        cats[category(name)] += ms
    total = sum(cats.values())
    print(f"TORCHKERNELS model={a.model} mbs={a.mbs} compile={a.compile} kernels={total:.1f} ms per step")
    for c, ms in sorted(cats.items(), key=lambda kv: -kv[1]):
        print(f"  {c:28s} {ms:8.2f} ms {100 * ms / total:5.1f}%")
    print("  longest kernels (ms per step, launches per step):")
    for name, (ms, n) in sorted(per_kernel.items(), key=lambda kv: -kv[1][0])[: a.top]:
        print(f"    {ms:8.2f} {n // steps:5d}  {name[:110]}")


if __name__ == "__main__":
    main()
