"""Peer of `bench_attention_gpu --sweep`: torch SDPA's FlashAttention-2 and cuDNN backends on the same shapes
(every head dim (q/k, v), b * s = 16k tokens, s 2048 and 4096, causal and not, bf16), forward and backward
timed separately with CUDA events (median of 30 after 5 warm-ups). Prints one PEER line per shape and backend;
a backend that refuses a shape prints why. Arguments D...: only the head dims whose q/k head dim is one of them."""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def median_ms(fn, warmup=5, repeats=30):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop))
    return sorted(times)[len(times) // 2]


def time_shape(backend, b, h, s, d, dv, causal):
    q, k = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    v = torch.randn(b, h, s, dv, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    with sdpa_kernel([backend]):
        forward = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        o = forward()
        grad = torch.randn_like(o)
        fwd = median_ms(forward)
        bwd = median_ms(lambda: torch.autograd.grad(o, (q, k, v), grad, retain_graph=True))
    return fwd, bwd


def main():
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, "
          f"{torch.cuda.get_device_name()}")
    only = [int(a) for a in sys.argv[1:]]
    for d, dv in [(64, 64), (80, 80), (96, 96), (128, 128), (192, 128), (256, 256)]:
        if only and d not in only:
            continue
        for s in (2048, 4096):
            for causal in (True, False):
                b, h = 16384 // s, 32 if d <= 96 else 16
                for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION):
                    shape = f"d={d} dv={dv} B={b} H={h} T={s} causal={int(causal)}"
                    try:
                        fwd, bwd = time_shape(backend, b, h, s, d, dv, causal)
                        print(f"PEER {backend.name} {shape} fwd_ms={fwd:.3f} bwd_ms={bwd:.3f}", flush=True)
                    except Exception as e:  # a backend that does not take the shape
                        print(f"PEER {backend.name} {shape} refused: {str(e).splitlines()[0][:120]}", flush=True)


if __name__ == "__main__":
    main()
