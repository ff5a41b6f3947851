"""Peer of bench_gemm_gpu: torch.matmul (bf16 in, bf16 out, fp32 accumulate) on the linear-layer GEMMs of
torch_gpt.py's models at the engine's token counts (layer 0 and the LM head per loss chunk), random
operands, CUDA-event timing (3 warm-ups, median of 20). Forward y = x w^T, data gradient dx = dy w, weight
gradient dw = dy^T x as autograd issues them under autocast."""
import os, sys
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_gpt  # noqa: E402

LOSS_CHUNK_BYTES = 256 << 20


def median_ms(fn, reps=20):
    for _ in range(3):
        fn()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); e.synchronize(); ts.append(s.elapsed_time(e))
    return sorted(ts)[len(ts) // 2]


def main():
    for name, mbs in (("gpt-1.3b", 4), ("llama-1b", 2)):
        L, h, nh, nkv, ffn, V, T, sw = torch_gpt.CONFIGS[name]
        tokens = mbs * T
        hd = h // nh
        chunks = -(-tokens * V * 2 // LOSS_CHUNK_BYTES)
        rows = -(-tokens // chunks)
        linears = [("qkv", tokens, (nh + 2 * nkv) * hd, h), ("proj", tokens, h, h),
                   ("fc1", tokens, 2 * ffn if sw else ffn, h), ("fc2", tokens, h, ffn), ("logits", rows, V, h)]
        print(f"TORCHGEMMS model={name} mbs={mbs} (TFLOP/s)")
        tot_ms = tot_fl = 0.0
        for label, m, n, k in linears:
            x = torch.rand(m, k, device="cuda", dtype=torch.bfloat16) * 2 - 1
            w = (torch.rand(n, k, device="cuda", dtype=torch.bfloat16) * 2 - 1) * 0.05
            dy = (torch.rand(m, n, device="cuda", dtype=torch.bfloat16) * 2 - 1) * 0.05
            fl = 2.0 * m * n * k
            res = []
            for fn in (lambda: x @ w.t(), lambda: dy @ w, lambda: dy.t() @ x):
                ms = median_ms(fn)
                res.append(fl / ms / 1e9)
                tot_ms += ms; tot_fl += fl
            print(f"  {label:8s} m={m:6d} n={n:6d} k={k:6d}  fwd {res[0]:4.0f}  dgrad {res[1]:4.0f}  wgrad {res[2]:4.0f}")
            del x, w, dy
        print(f"  all: {tot_fl / tot_ms / 1e9:.0f} TFLOP/s")


if __name__ == "__main__":
    main()
