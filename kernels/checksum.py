"""Page checksums of the index-K cache, for the canary (nblib.instruments.canary): one int64 per
chosen page, so a replay is checked by reading only the pages that matter (the batch's index-K
pages plus a sample of the free ones), not the whole cache.

    checksum(page) = sum_i int32(word_i) * w_i  (mod 2^64),  w_i = (i * 2654435761 + 0x9E3779B9) | 1

over the page's 32-bit words, the canary's definition: an odd, position-dependent weight, so a
moved or swapped entry changes it too. bf16 [P, 64, D] and fp8 [P, 64*D + 256] caches alike.

Layout: reference, kernel, launcher, check, benchmark.
"""

import torch
import triton
import triton.language as tl

from kernels import args as A
from kernels.harness import median_us
from kernels.launch import Case, Launch, run

__all__ = [
    "CHECKSUM_CONFIG",
    "GOLDEN",
    "OFFSET",
    "benchmark",
    "check",
    "compile_cases",
    "page_checksums",
    "page_checksums_",
    "page_words",
    "plan_checksums",
    "ref_page_checksums",
    "weights",
]

# ---------------------------------------------------------------------------
# 1. Torch reference
# ---------------------------------------------------------------------------

GOLDEN = 2654435761  # Knuth's multiplicative hash constant
OFFSET = 0x9E3779B9


def page_words(cache: torch.Tensor) -> torch.Tensor:
    """The cache as [pages, words] int32 (a view): every page must be whole 32-bit words."""
    A.tensor("cache", cache, contiguous=True)
    A.need(cache.dim() >= 2, f"cache must be [pages, ...], got shape {tuple(cache.shape)}")
    nbytes = cache[0].numel() * cache.element_size()
    A.need(nbytes % 4 == 0, f"a cache page of {nbytes} bytes is not whole 32-bit words")
    return cache.view(torch.uint8).view(cache.shape[0], -1).view(torch.int32)


def weights(n_words: int, device: torch.device | str) -> torch.Tensor:
    return (torch.arange(n_words, device=device, dtype=torch.int64) * GOLDEN + OFFSET) | 1


def ref_page_checksums(cache: torch.Tensor, page_ids: torch.Tensor) -> torch.Tensor:
    """int64 [n]: the checksum of each page in page_ids (torch; wraps like the kernel)."""
    words = page_words(cache)[page_ids.long()]
    return (words.to(torch.int64) * weights(words.shape[1], cache.device)).sum(1)


# ---------------------------------------------------------------------------
# 2. Triton kernel
# ---------------------------------------------------------------------------


@triton.jit
def _page_checksum_kernel(words_ptr, ids_ptr, out_ptr, n_words, BLOCK: tl.constexpr):
    """One program per chosen page. uint64 arithmetic: it wraps by definition, and two's
    complement makes the result the same bits as the reference's int64 sum."""
    i = tl.program_id(0)
    page = tl.load(ids_ptr + i).to(tl.int64)
    base = words_ptr + page * n_words
    acc = tl.zeros([BLOCK], tl.uint64)
    for start in range(0, n_words, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        ok = offs < n_words
        w = tl.load(base + offs, mask=ok, other=0).to(tl.int64).to(tl.uint64, bitcast=True)
        weight = (offs.to(tl.uint64) * 2654435761 + 0x9E3779B9) | 1
        acc += w * weight
    tl.store(out_ptr + i, tl.sum(acc).to(tl.int64, bitcast=True))


# ---------------------------------------------------------------------------
# 3. Launcher
# ---------------------------------------------------------------------------

CHECKSUM_CONFIG = dict(block=1024, num_warps=4)  # a 16 KB bf16 page: 4 steps of 4 KB


def plan_checksums(
    cache: torch.Tensor, page_ids: torch.Tensor, out: torch.Tensor, config: dict | None = None
) -> Launch:
    words = page_words(cache)
    A.tensor("page_ids", page_ids, (torch.int32, torch.int64), ndim=1, contiguous=True)
    A.tensor("out", out, torch.int64, shape=(page_ids.shape[0],), contiguous=True)
    A.same_device(cache=cache, page_ids=page_ids, out=out)
    cfg = dict(CHECKSUM_CONFIG, **(config or {}))
    args = dict(words_ptr=words, ids_ptr=page_ids, out_ptr=out, n_words=words.shape[1], BLOCK=cfg["block"])
    return Launch(_page_checksum_kernel, (page_ids.shape[0],), args, dict(num_warps=cfg["num_warps"]))


def page_checksums_(
    cache: torch.Tensor, page_ids: torch.Tensor, out: torch.Tensor, *, config: dict | None = None
) -> torch.Tensor:
    """Triton: out[j] = checksum of page page_ids[j]. Allocates nothing; ids are not range-checked
    (that would sync): keep them in [0, pages)."""
    launch = plan_checksums(cache, page_ids, out, config)
    A.launchable(launch.kernel, cache.device)
    if page_ids.shape[0]:
        run(launch)
    return out


def page_checksums(cache: torch.Tensor, page_ids: torch.Tensor) -> torch.Tensor:
    """Checksums of the chosen pages: the kernel on CUDA, the reference elsewhere."""
    if cache.device.type == "cuda":
        out = torch.empty(page_ids.shape[0], dtype=torch.int64, device=cache.device)
        return page_checksums_(cache, page_ids, out)
    return ref_page_checksums(cache, page_ids)


def compile_cases(arch: int) -> list[Case]:

    ids, out = torch.zeros(512, dtype=torch.int32), torch.empty(512, dtype=torch.int64)
    return [
        Case(f"checksum_{name}", plan_checksums(cache, ids, out), tensor_core=False, tma=False)
        for name, cache in (
            ("bf16", torch.zeros(8, 64, 128, dtype=torch.bfloat16)),
            ("fp8", torch.zeros(8, 64 * 128 + 256, dtype=torch.uint8)),
        )
    ]


# ---------------------------------------------------------------------------
# 4. check()
# ---------------------------------------------------------------------------


def check(device: str = "cuda", pages: int = 300, dim: int = 128, n: int = 64, seed: int = 0) -> dict:
    """Kernel vs reference on random bf16 and fp8 caches (with repeated and boundary page ids),
    and the property the canary relies on: one changed or swapped entry changes the checksum."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    ids = torch.randint(0, pages, (n,), generator=g, dtype=torch.int32)
    ids[:3] = torch.tensor([0, pages - 1, 0], dtype=torch.int32)
    caches = dict(
        bf16=torch.randn(pages, 64, dim, generator=g).bfloat16(),
        fp8=torch.randint(0, 256, (pages, 64 * dim + 256), generator=g, dtype=torch.uint8),
    )
    ids_d = ids.to(device)
    for name, host in caches.items():
        cache = host.to(device)
        out = torch.empty(n, dtype=torch.int64, device=device)
        page_checksums_(cache, ids_d, out)
        want = ref_page_checksums(cache, ids_d)
        if not torch.equal(out, want):
            raise AssertionError(f"{name}: checksums differ at {int((out != want).sum())} of {n} pages")
        p = int(ids[0])
        edited = cache.clone()
        edited[p, 5], edited[p, 6] = cache[p, 6].clone(), cache[p, 5].clone()  # swap two entries
        if bool((cache[p, 5] != cache[p, 6]).any()) and torch.equal(
            page_checksums_(edited, ids_d[:1], out[:1]), want[:1]
        ):
            raise AssertionError(f"{name}: swapping two entries left the checksum unchanged")
    return dict(pages=n, caches=list(caches))


# ---------------------------------------------------------------------------
# 5. benchmark()
# ---------------------------------------------------------------------------


def benchmark(pages: int = 11000, n: int = 1024, dim: int = 128, device: str = "cuda") -> list[dict]:
    """Rows for the bench table: n chosen pages of a gpu-profile-sized bf16 cache, the kernel and
    the torch reference on the same pages, and every page (the canary's checksums without page_ids)."""
    cache = torch.randn(pages, 64, dim, device=device).bfloat16()
    ids = torch.randperm(pages, device=device)[:n].int()
    out = torch.empty(n, dtype=torch.int64, device=device)
    all_ids = torch.arange(pages, device=device, dtype=torch.int32)
    all_out = torch.empty(pages, dtype=torch.int64, device=device)
    page = 64 * dim * 2
    rows: list[dict] = []
    for name, fn, nbytes in (
        ("triton_checksum", lambda: page_checksums_(cache, ids, out), n * page),
        ("torch_checksum", lambda: ref_page_checksums(cache, ids), n * page),
        ("triton_checksum_all_pages", lambda: page_checksums_(cache, all_ids, all_out), pages * page),
    ):
        us = median_us(fn)
        rows.append(dict(name=name, us=us, bytes=nbytes, gbps=nbytes / us * 1e-3))
    rows[0]["speedup_vs_torch"] = rows[1]["us"] / rows[0]["us"]
    return rows
