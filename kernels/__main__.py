"""python -m kernels --check | --bench | --sweep [--out DIR] [--only NAMES] (on a CUDA GPU)

  --check   every kernel against its reference (logits with the table's configs and the TMA and
            persistent variants, top-k, page checksums, differential); check.json in DIR
  --bench   one table for every kernel: time, fraction of the copy bandwidth measured in the same
            run, speedup over its torch path; bench.{json,md} in DIR with commit, device, versions
  --sweep   the logits kernel's launch configs (kernels.logits_bench.sweep) and the top-k's;
            sweep.{json,md} in DIR, with the CONFIGS lines that would adopt the winners
  --only    some of logits, topk, checksum, differential, badrows (comma-separated; default all)

Top-k rows: each of kernels.topk.KERNELS (triton_topk_fused, the default, and triton_topk_bound)
beside torch_topk; us_dirty_l2 and speedup_vs_torch_dirty_l2 after do_bench's
dirty L2 flush.

One command for the committed tables, on the H200 (about 3 minutes):
  python -m kernels --check --sweep --bench --out outputs/bench
"""

import argparse
import json
import os
import sys
from collections.abc import Sequence

import torch

from kernels import (
    badrows,
    checksum,
    differential,
    logits_bench,
    logits_check,
    topk,
    topk_check,
    topk_fused,
)
from kernels.harness import copy_row, flushing, median_us, meta, write_atomic, write_table
from kernels.launch import arch_of, run
from kernels.logits_configs import BENCH_SHAPE, LogitsConfig, config_for

__all__ = ["bench_all", "check_all", "main", "sweep_topk", "sweep_topk_configs"]

BENCH_COLS = [
    "name",
    "us",
    "bytes",
    "gbps",
    "frac_copy_bw",
    "speedup_vs_torch",
    "us_dirty_l2",
    "frac_copy_bw_dirty_l2",
    "speedup_vs_torch_dirty_l2",
]
NAMES = ("logits", "topk", "checksum", "differential", "badrows")
# each config's fields, then what the sweep measured
SWEEP_COLS = ["kind", *(f for f in LogitsConfig._fields if f != "min_programs")]
SWEEP_COLS += ["ok", "us", "gbps", "vs_default", "default", "best"]
TOPK_SWEEP_COLS = ["stage", "kernel", *topk.TOPK_CONFIG, "ok", "us"]
FUSED_SWEEP_COLS = ["kernel", *topk_fused.FUSED_CONFIG, "ok", "us"]
FUSED_SWEEP = [  # over topk_fused.FUSED_CONFIG, its first row
    dict(),
    dict(radix_bits=8),
    dict(maxima=2048),
    dict(maxima=4096),
    dict(bound_passes=1, cap=2048),
    dict(bound_warps=4),
    dict(bound_warps=16),
    dict(chunk=8192, num_warps=16),
    dict(pdl=0),
]
TOPK_SWEEP = [  # over topk.TOPK_CONFIG (the "bound" kernel), its first row
    dict(),
    dict(block=4096, num_warps=16),  # larger blocks: 41.8 us against 29.3 (7cc72f5)
    dict(block=4096, num_warps=16, bound_passes=0, radix_bits=8),  # the exact bound and 8-bit digits
    dict(block=2048, num_warps=8),
    dict(block=2048, num_warps=16),
    dict(num_warps=4),
    dict(num_warps=16),
    dict(block=512, num_warps=4),
    dict(block=512, num_warps=8),
    dict(radix_bits=8),
    dict(bound_passes=0),
    dict(bound_passes=1),
    dict(bound_passes=3),
    dict(maxima=2048),
    dict(pdl=0),  # the select kernel launched after the maxima kernel's last CTA, not during its tail
]


# the load paths and grids the sweep times, checked for correctness first
LOGITS_VARIANTS = [
    dict(block_t=64, tiles_per_prog=8, num_warps=4, num_stages=5, k_load="tma"),
    dict(block_t=128, tiles_per_prog=4, num_warps=4, num_stages=3, persistent=2),
    dict(block_t=64, tiles_per_prog=16, num_warps=4, num_stages=5, k_load="tma", scale_load="prefetch"),
]


def _check_logits():
    results = {}
    for i, c in enumerate(logits_check.CHECK_CASES):
        results[f"logits_{i}"] = dict(case=c, errors=logits_check.check(**c))
    arch = arch_of(torch.device("cuda"))
    for i, cfg in enumerate(LOGITS_VARIANTS):
        if cfg.get("k_load") == "tma" and arch < 90:  # the launcher refuses TMA below sm_90 (no descriptors)
            results[f"logits_variant_{i}"] = dict(config=cfg, skipped=f"TMA needs sm_90, not sm_{arch}")
            continue
        results[f"logits_variant_{i}"] = dict(config=cfg, errors=logits_check.check(bs=7, config=cfg))
    return results


def _check_topk():
    return {f"topk_{kernel}": topk_check.check(kernel=kernel) for kernel in topk.KERNELS}


CHECKS = dict(
    logits=_check_logits,
    topk=_check_topk,
    checksum=lambda: dict(checksum=checksum.check()),
    differential=lambda: dict(differential=differential.check()),
    badrows=lambda: dict(badrows=badrows.check()),
)
BENCHES = dict(
    logits=logits_bench, topk=topk, checksum=checksum, differential=differential, badrows=badrows
)  # .benchmark()


def check_all(names: Sequence[str] = NAMES) -> dict:
    """The kernels named against their references (raises on the first failure); the results by
    name."""
    results = {}
    for name in names:
        results.update(CHECKS[name]())
    for name, r in results.items():
        print(name, r, flush=True)
    return results


def _bench_rows(names):
    rows = [copy_row()]
    for name in names:
        rows += BENCHES[name].benchmark()
    return rows


def bench_all(names: Sequence[str] = NAMES) -> list[dict]:
    """The named kernels' rows after the copy row, timed after a clean L2 flush (us) and after
    do_bench's dirty one (us_dirty_l2, kernels.harness.FLUSHES); fractions of the copy's bandwidth
    and speedups over the torch row a row names (vs) under the same flush filled in."""
    rows = _bench_rows(names)
    with flushing("dirty"):
        dirty = {r["name"]: r["us"] for r in _bench_rows(names)}
    for r in rows:
        r.setdefault("gbps", r["bytes"] / r["us"] * 1e-3)
        r["frac_copy_bw"] = r["gbps"] / rows[0]["gbps"]
        r["us_dirty_l2"] = dirty[r["name"]]
        r["frac_copy_bw_dirty_l2"] = r["bytes"] / r["us_dirty_l2"] / (rows[0]["bytes"] / dirty["copy"])
        if "vs" in r:
            r["speedup_vs_torch_dirty_l2"] = dirty[r["vs"]] / r["us_dirty_l2"]
    return rows


def sweep_topk(bs: int = 32, width: int = 65536, k: int = 512) -> list[dict]:
    x = torch.randn(bs, width, device="cuda")
    out = torch.empty(bs, k, dtype=torch.int32, device="cuda")
    want = topk.ref_topk_indices(x, k)
    rows = []
    for cfg in TOPK_SWEEP:
        fn = lambda cfg=cfg: topk.topk_indices_triton(x, k, out=out, config=cfg, kernel="bound")  # noqa: E731
        ok = bool(torch.equal(fn(), want))
        full = dict(topk.TOPK_CONFIG, **cfg)
        rows.append(
            dict(kind="topk", stage="both", kernel="bound", **full, ok=ok, us=median_us(fn, rep_ms=40))
        )
    # where the time goes: the sub-chunk maxima launch alone (the rest is the one-program-per-row select)
    maxima, _ = topk.plan_topk(x, k, out=out)
    rows.append(dict(kind="topk", stage="maxima", ok=None, us=median_us(lambda: run(maxima), rep_ms=40)))
    return rows


def sweep_topk_configs(
    kernel: str, configs: list[dict], default: dict, bs: int = 32, width: int = 65536, k: int = 512
) -> list[dict]:
    """One top-k kernel's configs (over its default), each checked, then timed."""
    x = torch.randn(bs, width, device="cuda")
    out = torch.empty(bs, k, dtype=torch.int32, device="cuda")
    want = topk.ref_topk_indices(x, k)
    rows = []
    for cfg in configs:
        fn = lambda cfg=cfg: topk.topk_indices_triton(x, k, out=out, config=cfg, kernel=kernel)  # noqa: E731
        ok = bool(torch.equal(fn(), want))
        rows.append(dict(kernel=kernel, **dict(default, **cfg), ok=ok, us=median_us(fn, rep_ms=40)))
    return rows


def _names(only):
    names = tuple(n for n in (only or ",".join(NAMES)).split(",") if n)
    bad = sorted(set(names) - set(NAMES))
    if bad or not names:
        sys.exit(f"python -m kernels: --only takes some of {','.join(NAMES)}, got {only!r}")
    return names


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m kernels", description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="compare every kernel with its reference")
    p.add_argument("--bench", action="store_true", help="time every kernel vs torch and a D2D copy")
    p.add_argument("--sweep", action="store_true", help="time the launch configs")
    p.add_argument("--out", default=None, help="folder for bench.{json,md} and sweep.{json,md}")
    p.add_argument("--only", default=None, help=f"comma-separated, some of {','.join(NAMES)}")
    a = p.parse_args(argv)
    names = _names(a.only)
    if not (a.check or a.bench or a.sweep):
        p.error("nothing to do: pass --check, --bench and/or --sweep")
    if a.out:
        os.makedirs(a.out, exist_ok=True)  # a bad --out fails here, before minutes of work
    if not torch.cuda.is_available():
        sys.exit("python -m kernels: needs a CUDA GPU (the tests run the kernels on a CPU, interpreted)")
    if a.check:
        results = check_all(names)
        if a.out:
            text = json.dumps(dict(meta=meta(), results=results), indent=2, default=str)
            write_atomic(os.path.join(a.out, "check.json"), text)
    if a.sweep and "logits" in names:
        rows = logits_bench.sweep()
        info = meta(shape=BENCH_SHAPE, adopt=logits_bench.adopt_lines(rows))
        print(write_table(a.out, "sweep", info, rows, SWEEP_COLS))
    if a.sweep and "topk" in names:
        info = meta(shape=dict(bs=32, width=65536, k=512), default=topk.TOPK_CONFIG)
        print(write_table(a.out, "sweep_topk", info, sweep_topk(), TOPK_SWEEP_COLS))
        shape = dict(bs=32, width=65536, k=512)
        default = topk_fused.FUSED_CONFIG
        rows = sweep_topk_configs("fused", FUSED_SWEEP, default)
        info = meta(shape=shape, default=default)
        print(write_table(a.out, "sweep_topk_fused", info, rows, FUSED_SWEEP_COLS))
    if a.bench:
        arch = arch_of(torch.device("cuda"))
        configs: dict[str, object] = {
            f"logits_{k}": config_for(k, arch, 64, 128)._asdict() for k in ("bf16", "fp8")
        }
        configs.update(topk=topk.TOPK_CONFIG, topk_fused=topk_fused.FUSED_CONFIG)
        configs.update(differential=differential.DIFF_CONFIG, topk_kernel=topk.TOPK_KERNEL)
        info = meta(shape=BENCH_SHAPE, configs=configs, only=list(names))
        print(write_table(a.out, "bench", info, bench_all(names), BENCH_COLS))


if __name__ == "__main__":
    main()
