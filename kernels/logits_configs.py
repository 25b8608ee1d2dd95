"""Launch configs of the logits kernel (kernels.logits): what runs where, why, and the pruned
space the sweep (kernels.logits_bench) times to choose them.

Lookup: config_for(kind, arch, heads, dim, smem_per_block) takes the entry for (kind, arch major,
heads, dim) if there is one, else (kind, arch major); an arch without an entry uses the nearest
lower major that has one. The model runs one shape (H 64, D 128), so the table holds the
per-architecture defaults; a sweep on another shape adds (kind, major, heads, dim) keys. The entry
then loses pipeline stages until its K ring leaves room for two CTAs per SM on the GPU's opt-in
shared memory per block (read from the device; kernels.launch): the rule the sweep's space is
pruned by. On sm_90 / sm_100 (227 KB) no entry changes; sm_89 and sm_120 (99 KB) run the pointer
entry's bf16 with 3 stages where sm_80 (163 KB) keeps 5.

sm_80 / sm_89 / sm_120 load K through pointers: Ampere and Ada have no TMA, and sm_120 (RTX
Blackwell) runs mma.sync like Ada, where nothing measured says a descriptor pays (as compiled, its
TMA path also keeps an 8-byte stack frame the pointer path does not). Their entries are the H200's
fastest pointer configs (h200-07fb1c5/sweep.md: bf16 141 us; fp8 82.8, 0.3 us behind the fastest,
a 3-stage one), compiled for each target and never run; a sweep on such a GPU (python -m kernels
--sweep) replaces them.
fp8 needs sm_89 or later (e4m3 tensor cores): the launchers refuse it on Ampere (kernels.launch).

Why these: the graph-timed sweep on the H200 (B 32, L 65536, H 64, D 128; outputs/bench/
h200-97c3053/sweep.md, rerun at 1ff4fed and ae105b8) put K through a TMA descriptor, one page a
tile, ahead of every pointer config: bf16 139-142 us against 146-179, fp8 80.4-81.7 against
87.9-111. With pointers the page-id load feeds the K load's address, a chain that costs the
software pipeliner stages; the descriptor path prefetches the page id with the box. As compiled
(compile_sm90.md): bf16 66 KB of shared memory, 3 CTAs per SM; fp8 (3 stages) 25 KB and 64
registers, 8 CTAs per SM.
fp8 loads each tile's scales a tile ahead (scale_load "prefetch"): the pipeliner leaves that load in
the iteration that uses it; ahead, the sweep at 7f3c9a9 read 79.4-80.7 us against 80.5-83.0 (a
TMA box for the scales read 85-86, and left the space). Those figures are after do_bench's dirty
L2 flush; since a0bb8c1 the tables time after a clean one (kernels.harness.FLUSHES), where the
same configs read bf16 134-135 us and fp8 73.7-74.0 (h200-85cce14, -4f5b6ef, -07fb1c5/sweep.md;
fp8's 4 stages tie with 3 within 0.3 us in all three, so the entry keeps 3).

sm_100 takes the H200's winners, compiled and never run (compile_sm100.md: tcgen05.mma, TMA, no
spills); tests/test_kernel_compile.py holds each sm_100 entry to sm_90's CTAs per SM, or where
sm_100a's registers cap every config of the space lower (fp8: 80 registers, 6 CTAs), to the best
of them.

Two pages an iteration (two TMA boxes, block_t 128) held the compiled loop to 5 CTA-wide barriers
per two pages instead of 8, and ran slower: fp8 90.6 us against 79.3 (outputs/bench/h200-a8ca975,
fp8_probe.md; 5 CTAs per SM instead of 8), so it left the kernel. The other load paths (pointers,
TMA gather on sm_100, a persistent grid) stay in the sweep's space and become defaults only when a
committed sweep table shows them faster.
"""

from typing import NamedTuple

from kernels.launch import Target, facts
from kernels.paged import DIM

__all__ = [
    "BENCH_SHAPE",
    "CONFIGS",
    "K_LOADS",
    "LogitsConfig",
    "as_config",
    "candidates",
    "config_for",
    "fit",
    "launch_config",
    "smem_budget",
    "smem_estimate",
]

K_LOADS = ("ptr", "tma", "gather")  # gather: TMA gather4 rows, sm_100 and later only


class LogitsConfig(NamedTuple):
    block_t: int  # entries per tile, a multiple of PAGE (k_load "tma": 64, one TMA box, one page)
    tiles_per_prog: int  # tiles one work item walks (at most; fewer when the batch is small)
    num_warps: int
    num_stages: int
    min_programs: int = 1024  # below this many work items, split the context finer
    k_load: str = "ptr"  # how K tiles reach shared memory: pointers, a TMA tile, TMA gather
    persistent: int = 0  # 0: one program per work item; n: n programs per SM walk them all
    scale_load: str = "ptr"  # fp8 scales: pointers in the tile's iteration, or (with k_load "tma")
    # "prefetch": pointers issued one tile ahead


BENCH_SHAPE = dict(bs=32, ctx=65536, heads=64, dim=128)  # the shape: one decode step
CONFIGS: dict[tuple, LogitsConfig] = {
    # the sweep's winners on the H200, timed from CUDA graph replays: K through a TMA descriptor,
    # one page a tile (outputs/bench/h200-97c3053/sweep.md: bf16 142 us, 150 with pointers); fp8's
    # scales loaded a tile ahead, 3 stages (h200-7f3c9a9/sweep.md: 79.4 us, 80.5-81.0 without)
    ("bf16", 9): LogitsConfig(block_t=64, tiles_per_prog=8, num_warps=4, num_stages=5, k_load="tma"),
    ("fp8", 9): LogitsConfig(64, 16, 4, 3, k_load="tma", scale_load="prefetch"),
    # sm_100 takes the H200's winners; the compile check (tests/test_kernel_compile.py) holds each
    # to the CTAs per SM sm_90a's entry has, or to the best sm_100a allows, as compiled
    ("bf16", 10): LogitsConfig(block_t=64, tiles_per_prog=8, num_warps=4, num_stages=5, k_load="tma"),
    ("fp8", 10): LogitsConfig(64, 16, 4, 3, k_load="tma", scale_load="prefetch"),
    # no descriptor path (see the module docstring): the H200's fastest pointer configs,
    # h200-07fb1c5/sweep.md (bf16 141 us, fp8 82.8), 5 stages for copy/compute overlap in a CTA
    ("bf16", 8): LogitsConfig(block_t=64, tiles_per_prog=16, num_warps=4, num_stages=5),
    ("fp8", 8): LogitsConfig(block_t=64, tiles_per_prog=16, num_warps=4, num_stages=5),
    ("bf16", 12): LogitsConfig(block_t=64, tiles_per_prog=16, num_warps=4, num_stages=5),
    ("fp8", 12): LogitsConfig(block_t=64, tiles_per_prog=16, num_warps=4, num_stages=5),
}


def config_for(
    kind: str, arch: int, heads: int | None = None, dim: int | None = None, smem_per_block: int | None = None
) -> LogitsConfig:
    """The launch config for cache dtype kind ("bf16" | "fp8") on compute capability arch, fitted
    to smem_per_block (the device's opt-in shared memory per block; None: the arch's, from
    kernels.launch.ARCH_FACTS)."""
    majors = sorted({key[1] for key in CONFIGS if key[0] == kind and key[1] <= arch // 10})
    major = majors[-1] if majors else min(key[1] for key in CONFIGS if key[0] == kind)
    entry = CONFIGS.get((kind, major, heads, dim), CONFIGS[kind, major])
    return fit(entry, kind, dim or DIM, smem_per_block or facts(arch).smem_per_block)


def fit(config: LogitsConfig, kind: str, dim: int, smem_per_block: int) -> LogitsConfig:
    """config with pipeline stages taken off (down to 2) until its K ring fits smem_budget."""
    c, budget = config, smem_budget(smem_per_block)
    while c.num_stages > 2 and smem_estimate(kind, c.block_t, dim, c.num_stages) > budget:
        c = c._replace(num_stages=c.num_stages - 1)
    return c


def as_config(config: LogitsConfig | dict) -> LogitsConfig:
    """A LogitsConfig from a LogitsConfig or its dict, checked; one-line ValueError otherwise."""
    if not isinstance(config, LogitsConfig):
        try:
            config = LogitsConfig(**config)
        except TypeError as e:
            raise ValueError(f"config must give {', '.join(LogitsConfig._fields[:4])}: {e}") from None
    c = config
    if c.k_load not in K_LOADS:
        raise ValueError(f"config k_load {c.k_load!r}: choose one of {', '.join(K_LOADS)}")
    if c.block_t % 64 or c.block_t < 64 or (c.k_load == "tma" and c.block_t != 64):
        raise ValueError(f"config block_t={c.block_t}: a multiple of 64 (64 with k_load 'tma': a page a box)")
    if c.scale_load not in ("ptr", "prefetch") or (c.scale_load == "prefetch" and c.k_load != "tma"):
        raise ValueError(f"config scale_load {c.scale_load!r}: 'ptr', or 'prefetch' with k_load 'tma'")
    if c.tiles_per_prog < 1 or c.num_warps not in (1, 2, 4, 8, 16) or c.num_stages < 1 or c.persistent < 0:
        raise ValueError(f"config {c}: tiles_per_prog >= 1, num_warps a power of two <= 16, num_stages >= 1")
    return c


def launch_config(
    config: LogitsConfig | dict | None, kind: str, heads: int, dim: int, target: Target
) -> LogitsConfig:
    """config as given (a LogitsConfig or its dict, checked), else the table's entry for target at
    these heads and dim, fitted to its shared memory."""
    if config is not None:
        return as_config(config)
    return config_for(kind, target.arch, heads, dim, target.smem_per_block)


def smem_budget(smem_per_block: int) -> int:
    """Bytes of K ring a config may keep: half what a CTA may opt in to, so two CTAs fit an SM
    (sm_90 / sm_100: 113 KB of 227; sm_80: 81 of 163; sm_89 / sm_120: 49 of 99)."""
    return smem_per_block // 2


def smem_estimate(kind: str, block_t: int, dim: int, num_stages: int) -> int:
    """Bytes of the K tile ring the pipeliner keeps (the dominant shared-memory user)."""
    elem = 1 if kind == "fp8" else 2
    return num_stages * block_t * dim * elem


def candidates(
    kind: str, heads: int, dim: int, arch: int, smem_per_block: int | None = None
) -> list[LogitsConfig]:
    """The sweep's pruned space for (kind, heads, dim, arch): pointer loads around the measured
    defaults, TMA page tiles (sm_90+), TMA gather (sm_100+), each with and without a persistent
    grid at its best-guess shape; configs whose K ring cannot leave room for two CTAs per SM
    (smem_budget of smem_per_block, default the arch's) are dropped."""
    smem = smem_per_block or facts(arch).smem_per_block
    base = config_for(kind, arch, heads, dim, smem)
    space = [base]
    for block_t in (64, 128):
        for tiles in (4, 16):
            for stages in (3, 5, 7):
                space.append(LogitsConfig(block_t, tiles, 4, stages))
    tma = [LogitsConfig(64, 8, 4, 5, k_load="tma")] if arch >= 90 else []
    for tiles in (8, 16) if tma else ():
        for stages in (3, 4, 5):
            space.append(LogitsConfig(64, tiles, 4, stages, k_load="tma"))
            if kind == "fp8":  # the scales' load issued a tile ahead
                space.append(LogitsConfig(64, tiles, 4, stages, k_load="tma", scale_load="prefetch"))
    if arch >= 100:
        for block_t in (64, 128):
            for stages in (3, 5):
                space.append(LogitsConfig(block_t, 8, 4, stages, k_load="gather"))
    space += [c._replace(persistent=2) for c in (base, *tma)]
    space.append(base._replace(num_warps=8))
    kept = []
    for c in space:
        if c not in kept and smem_estimate(kind, c.block_t, dim, c.num_stages) <= smem_budget(smem):
            kept.append(c)
    return kept
