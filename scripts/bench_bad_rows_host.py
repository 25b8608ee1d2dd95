"""Host time of a step's verdict (the rows a replay corrupted): torch's definition against the one
launch of kernels.badrows, each called 3,000 times after 50 warm-up calls, the queue drained
before and after (the host's time is what a decode loop of 30,000 steps pays). On a CUDA GPU:

    python scripts/bench_bad_rows_host.py
"""

import sys
import time

import torch

from kernels import badrows


def host_us(fn, calls=3000, warmup=50):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    us = (time.perf_counter() - t) / calls * 1e6
    torch.cuda.synchronize()
    return us


def main():
    if not torch.cuda.is_available():
        sys.exit("no CUDA GPU here: run it on the GPU machine")
    for bs in (1, 40):  # the gpu profile's smallest and busiest buckets, its 4096-wide output, top-512
        ref = torch.randn(bs, 4096, device="cuda").bfloat16()
        out = ref.clone()
        topk = torch.randint(0, 1 << 16, (bs, 512), device="cuda", dtype=torch.int32)
        args = (out, ref, topk, topk, 1e-2)
        for name, fn in (("torch", badrows.ref_bad_rows), ("triton", badrows.bad_rows)):
            print(f"bs {bs} {name}: host {host_us(lambda f=fn, a=args: f(*a)):.1f} us a call")


if __name__ == "__main__":
    main()
