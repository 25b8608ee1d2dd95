"""The key figures of each committed results file, as markdown tables for docs/results.md
(nblib.publish.results_doc). Each function reads one kind of file and copies its figures; none
computes a finding the file does not hold, so the page says only what a run measured."""

import json
import re
from pathlib import Path

from pydantic import BaseModel

from nblib.core.paths import ROOT
from nblib.publish.show import markdown_table
from nblib.schema import tuned


class Block(BaseModel):
    """One titled table (or sentence) of a page."""

    title: str
    body: str


class Bench(BaseModel):
    path: str  # the bench.json, relative to the repository
    meta: dict
    rows: list[dict]

    @property
    def partial(self):
        return bool(self.meta.get("only"))  # a table of some kernels only (`--only`)


class Cost(BaseModel):
    """What the instruments cost per replay in one instrument_cost.json."""

    path: str
    commit: str
    device: str
    bucket: int | None
    plain_ms: float | None
    ratios: dict[str, float]


class Window(BaseModel):
    """One run of `python -m nblib window`: the profile it wrote and every point it measured."""

    path: str
    commit: str
    device: str
    points: list[str]
    reason: str


def _frac(k, n):
    return f"{k}/{n}"


def _pct(x):
    return f"{100 * x:.1f}%" if isinstance(x, (int, float)) else "-"


def _num(x, fmt="{:.3g}"):
    return fmt.format(x) if isinstance(x, (int, float)) else "-"


def _block(title, rows):
    return Block(title=title, body=markdown_table(rows)) if rows else None


def _rel(path):
    return str(Path(path).resolve().relative_to(ROOT))


def short(sha):
    """A commit as the page shows it: 7 hex digits, "+dirty" kept (a run from an uncommitted tree)."""
    base, _, dirty = str(sha or "unknown").partition("+")
    return (base[:7] if re.fullmatch(r"[0-9a-f]{7,40}", base) else base) + (f"+{dirty}" if dirty else "")


# --- the notebooks --------------------------------------------------------------------------


def _protocol(r):
    runs = r.get("protocol", {}).get("runs", [])
    rows = [
        dict(
            seed=x["seed"],
            sessions=_frac(x["corrupted_sessions"], x["sessions"]),
            steps=_frac(x["corrupted_steps"], x["steps"]),
            rows_per_corrupted_step=x.get("rows_per_corrupted_step", "-"),
        )
        for x in runs
    ]
    checks = [
        dict(
            configuration=f"{c['index_dtype']} + {c['mode']} + overlap {c['overlap']}",
            runs=c["runs"],
            sessions=_frac(c["corrupted_sessions"], c["sessions"]),
            wilson_95=f"{_pct(c['lo'])} to {_pct(c['hi'])}",
            dispersion_p=_num(c.get("dispersion_p")),
            expected=c.get("expected", "-"),
            holds=c.get("holds"),
        )
        for c in r.get("protocol_checks", [])
    ]
    blocks = [
        dict(
            seeds=f"{b['base_seed']}-{b['base_seed'] + len(b['runs']) - 1}",
            runs=" ".join(str(x["corrupted_sessions"]) for x in b["runs"]),
            sessions=_frac(b["pooled"]["corrupted_sessions"], b["pooled"]["sessions"]),
            wilson_95=f"{_pct(b['pooled']['lo'])} to {_pct(b['pooled']['hi'])}",
            dispersion_p=_num(b["dispersion_p"]),
            by_bucket=", ".join(
                f"{x['bucket']}: {x['corrupted_steps']}/{x['steps']}" for x in b.get("bucket_steps", [])
            ),
        )
        for b in r.get("protocol", {}).get("blocks", [])
    ]
    return [
        _block("The protocol's runs (bf16 + graph + overlap on), one row a seed", rows),
        _block("The same protocol from each seed block (steps corrupted by bucket)", blocks),
        _block("The protocol on every configuration it checks", checks),
    ]


def _matrix(r):
    aliased = {a["bucket"] for a in r.get("aliases", []) if a.get("index_dtype") == "bf16"}
    rows = [
        dict(
            bucket=m["bucket"],
            sessions=_frac(m["corrupted_sessions"], m["sessions"]),
            steps=_frac(m["corrupted_steps"], m["steps"]),
            aliases="yes" if m["bucket"] in aliased else "no",
            measured="yes" if m["steps"] else "no step replayed this bucket",
        )
        for m in r.get("matrix", [])
        if (m["index_dtype"], m["mode"], m["overlap"]) == ("bf16", "graph", "on")
    ]
    checks = [
        dict(
            check=c["check"],
            sessions=_frac(c["corrupted"], c["sessions"]),
            upper_95=_pct(c.get("upper95")),
            expected=c["expected"],
            holds="not measured" if c.get("holds") is None else c["holds"],
        )
        for c in r.get("fingerprint", {}).get("checks", [])
    ]
    return [
        _block(
            "The matrix, bf16 + graph + overlap on, by bucket (aliases: the freed logits block reused)",
            rows,
        ),
        _block("The fingerprint's checks", checks),
    ]


def _canary(r):
    rows = [
        dict(
            overlap=c["overlap"],
            bucket=c["bucket"],
            sessions=_frac(c["corrupted_sessions"], c["sessions"]),
            replays=c.get("replays", "-"),
            pages_changed=c["pages_changed"],
            expected=c["pages_expected"],
            scratch=c.get("scratch_writes", "-"),
            free_page_writes=c.get("free_page_writes", "-"),
            live_overwrites=c["live_overwrites"],
        )
        for c in r.get("canary", [])
    ]
    return [_block("The canary by overlap and bucket (pages written against pages expected)", rows)]


def _overhead(r):
    rows = [
        dict(
            instrument=o["instrument"],
            bucket=o["bucket"],
            median_ms=_num(o["median_ms"], "{:.3f}"),
            ratio=_num(o.get("ratio"), "x{:.2f}"),
        )
        for o in r.get("overhead", [])
    ]
    return _block("What each instrument costs per replay (median of replays, against plain replay)", rows)


def _designs(r):
    arms = [r["off"], *r.get("designs", [])] if r.get("off") else r.get("designs", [])
    rows = [
        dict(
            design=d["design"],
            sessions=_frac(d["corrupted_sessions"], d["sessions"]),
            runs=" ".join(map(str, d.get("runs", []))),
            fisher_p_vs_off=_num(d.get("fisher_p"), "{:.2g}"),
            diverged=_frac(d.get("diverged", 0), d.get("comparisons", 0)),
            aliasing_pairs=d.get("pairs", "-"),
        )
        for d in arms
    ]
    return [_block("The differential's designs on the protocol", rows), _overhead(r)]


def _overlap(r):
    checks = [
        dict(check=c["check"], configurations=c["configurations"], failures=c["failures"], holds=c["holds"])
        for c in r.get("checks", [])
    ]
    said = [
        Block(title=t, body=r[k])
        for k, t in (("graph_verdict", "The graph CUDA built"), ("csan_verdict", "PyTorch's CUDA sanitizer"))
        if r.get(k)
    ]
    return [_block("The audit's checks over every capture", checks), *said]


def _fix(r):
    pooled = [
        dict(
            variant=p["variant"],
            buckets=", ".join(map(str, p["buckets"])),
            sessions=_frac(p["corrupted_sessions"], p["sessions"]),
            upper_95=_pct(p["hi"]),
        )
        for p in r.get("pooled", [])
    ]
    speed = [
        dict(
            bucket=s["bucket"],
            overlap_on_ms=_num(s["overlap_on_ms"], "{:.3f}"),
            overlap_off_ms=_num(s["overlap_off_ms"], "{:.3f}"),
            persistent_ms=_num(s["persistent_ms"], "{:.3f}"),
            record_stream_ms=_num(s["record_stream_ms"], "{:.3f}"),
            overlap_gain=_pct(s["overlap_gain"]),
        )
        for s in r.get("speed", [])
    ]
    checks = [dict(check=c["check"], measured=c["measured"], holds=c["holds"]) for c in r.get("checks", [])]
    return [
        _block("The fix: sessions corrupted over the buckets where the bug corrupted", pooled),
        _block("Decode-step time by bucket (median of replays)", speed),
        _block("The fix's checks", checks),
    ]


def _report(r):
    rows = [
        dict(notebook=n, in_the_writeup="yes" if ok else "no") for n, ok in r.get("notebooks", {}).items()
    ]
    return [_block("What the writeup read", rows)]


def _picked(title, rows, keys):
    """One table of `keys` from each row (a dash where a row lacks one)."""
    return [_block(title, [{k: x.get(k, "-") for k in keys} for x in rows or []])]


ENGINE_KEYS = ("model", "form", "backend", "expect", "status", "hazards", "replays", "replays_differing")
METHOD_KEYS = ("model", "form", "backend", "hazards", "confirmed", "forced", "natural", "probed")
EXTRACT = {
    "00_reproduce": lambda r: _protocol(r) + _matrix(r),
    "01_canary": _canary,
    "02_graph_vs_eager": _designs,
    "03_stream_overlap": _overlap,
    "04_persistent_buffer_fix": _fix,
    "05_report": _report,
    "06_audit_your_engine": lambda r: _picked("Every form on every backend", r.get("findings"), ENGINE_KEYS),
    "07_method_on_your_engine": lambda r: _picked("The method, form by form", r.get("rows"), METHOD_KEYS),
}


def for_notebook(r):
    return [b for b in EXTRACT.get(r.get("notebook"), lambda _: [])(r) if b]


# --- the kernels, the instruments' cost, the window, the audit on CUDA -----------------------

# The history's columns: each kernel under the names its rows have had.
HISTORY = (
    ("bf16 logits", ("triton_logits_bf16", "triton_bf16")),
    ("fp8 logits", ("triton_logits_fp8", "triton_fp8")),
    ("top-k", ("triton_topk", "triton_topk_bound")),
    ("top-k radix", ("triton_topk_radix",)),
    ("checksum", ("triton_checksum",)),
    ("differential", ("triton_differential",)),
)


def benches(root):
    out = []
    for path in sorted(Path(root).glob("*/bench.json")):
        data = json.loads(path.read_text())
        out.append(Bench(path=_rel(path), meta=data.get("meta", {}), rows=data.get("rows", [])))
    return out


def _kernel_rows(bench):
    rows = []
    for r in bench.rows:
        if not r["name"].startswith("triton_"):
            continue  # the torch rows are the speedups' denominators, and the copy the yardstick
        rows.append(
            dict(
                kernel=r["name"].removeprefix("triton_"),
                us=_num(r["us"], "{:.1f}"),
                fraction_of_copy_bandwidth=_num(r.get("frac_copy_bw"), "{:.2f}"),
                speedup_over_torch=_num(r.get("speedup_vs_torch"), "{:.2f}x"),
                us_after_do_bench_flush=_num(r.get("us_dirty_l2"), "{:.1f}"),
            )
        )
    return rows


def _bench_title(bench):
    m, shape = bench.meta, bench.meta.get("shape", {})
    copy = next((r for r in bench.rows if r["name"] == "copy"), {})
    only = f"; only {', '.join(m['only'])}" if bench.partial else ""
    dims = ", ".join(f"{k} {v}" for k, v in shape.items())
    where = f"{m.get('device', '-')}, commit {short(m.get('commit'))}"
    versions = f"torch {m.get('torch', '-')}, triton {m.get('triton', '-')}"
    gbps = _num(copy.get("gbps"), "{:.0f}")
    return f"`{bench.path}`: {where}, {versions}; {dims}; copy yardstick {gbps} GB/s{only}"


def kernel_tables(newest_first):
    """The newest full table of each device, and every partial table newer than it."""
    out, done = [], set()
    for b in newest_first:
        device = b.meta.get("device", "-")
        if device in done:
            continue
        out.append(Block(title=_bench_title(b), body=markdown_table(_kernel_rows(b))))
        if not b.partial:
            done.add(device)
    return out


def _history_cell(bench, names):
    r = next((r for r in bench.rows if r["name"] in names), None)
    if r is None:
        return "-"
    return _num(r.get("us_dirty_l2", r["us"]), "{:.1f}")  # tables before the clean flush hold only that


def kernel_history(newest_first):
    rows = []
    for b in newest_first:
        row = dict(
            bench=b.path.split("/")[-2], torch=b.meta.get("torch", "-"), triton=b.meta.get("triton", "-")
        )
        row.update({col: _history_cell(b, names) for col, names in HISTORY})
        rows.append(row)
    return markdown_table(rows)


# The notes committed beside the timing tables (anything else is listed by its name alone).
NOTES = {
    "sweep.md": "the logits kernels' config sweep",
    "sweep_topk.md": "the top-k's config sweep",
    "fp8_probe.md": "where the fp8 logits kernel's time goes",
    "fp8_experiments.md": "fp8 variants timed and dropped",
    "ncu_fp8.txt": "Nsight Compute on the fp8 logits kernel",
}


class NoteFile(BaseModel):
    path: str
    name: str
    commit: str  # from the folder's name, <device>-<commit>[-<what>]: the probes write no meta


def _folder_commit(name):
    """The commit in a folder's name <device>-<commit>[-<what>] (h200-28675cc-badrows): its first
    part after the device that reads as a hex sha; the name as it is when none does."""
    return next((p for p in name.split("-")[1:] if re.fullmatch(r"[0-9a-f]{7,40}", p)), name)


def bench_notes(root):
    return [
        NoteFile(path=_rel(p), name=p.name, commit=_folder_commit(p.parent.name))
        for p in sorted(Path(root).glob("*-*/*"))
        if p.suffix in (".md", ".txt") and p.name != "bench.md"  # bench.md repeats bench.json
    ]


def notes_list(newest_first):
    """One line per kind of note: what it holds, then every copy, newest first."""
    order = list(NOTES)  # the known kinds in NOTES' order, then any other by name
    names = sorted(
        {n.name for n in newest_first}, key=lambda n: (order.index(n) if n in NOTES else len(order), n)
    )
    lines = []
    for name in names:
        paths = ", ".join(f"`{n.path}`" for n in newest_first if n.name == name)
        lines.append(f"- {NOTES.get(name, name)}: {paths}")
    return "\n".join(lines)


def instrument_costs(root):
    out = []
    for path in sorted(Path(root).glob("*/instrument_cost.json")):
        data = json.loads(path.read_text())
        rows, meta = data.get("rows", []), data.get("meta", {})
        plain = next((r for r in rows if r["instrument"] == "neither"), {})
        out.append(
            Cost(
                path=_rel(path),
                commit=short(meta.get("commit")),
                device=meta.get("device", "-"),
                bucket=plain.get("bucket"),
                plain_ms=plain.get("median_ms"),
                ratios={r["instrument"]: r["ratio"] for r in rows if r.get("ratio") is not None},
            )
        )
    return out


def cost_table(costs):
    names = sorted({k for c in costs for k in c.ratios})
    rows = [
        dict(
            file=c.path,
            device=c.device,
            bucket=c.bucket,
            plain_replay_ms=_num(c.plain_ms, "{:.3f}"),
            **{n: _num(c.ratios.get(n), "x{:.2f}") for n in names},
        )
        for c in costs
    ]
    return markdown_table(rows)


def windows(root):
    """Each folder's `python -m nblib window` runs, from the search records beside the profiles they
    wrote (nblib.schema.tuned)."""
    return [
        Window(
            path=_rel(folder),
            commit=short(record.commit),
            device=record.device,
            points=[p.line() for p in record.points],
            reason=record.reason,
        )
        for folder in sorted(Path(root).glob("*-*/"))
        for record in tuned.read_records(folder)
    ]


def audit_blocks(r):
    s = r.get("summary", {})
    zoo = dict(
        scenarios=s.get("scenarios"),
        planted_races=s.get("races"),
        right=s.get("right"),
        false_alarms=s.get("false_alarms"),
        missed=s.get("missed"),
        captures_broken_by_the_audit=s.get("captures_broken_by_the_audit"),
        graph_agrees=s.get("graph_agrees"),
    )
    model = [
        dict(
            capture=f"{m['index_dtype']} + overlap {m['overlap']} + {m['logits_policy']}",
            bucket=g["bucket"],
            hazards=g["hazards"],
            confirmed_unordered=g["confirmed"],
            contradicted=g["contradicted"],
            missed=g["missed"],
            agree=g["agree"],
        )
        for m in r.get("model_audit", [])
        for g in m.get("graph", [])
    ]
    parity = [
        dict(
            case=p["case"],
            rule=p["rule"],
            cuda_rule=p["cuda_rule"] or "-",
            captures_again=p["cuda_captures_again"],
        )
        for p in r.get("parity", [])
    ]
    return [
        _block("The zoo: planted races and their race-free twins", [zoo]),
        _block(
            "The decode model's captures: the audit against the graph read back through the driver", model
        ),
        _block("Capture rules: the simulator's rule and what CUDA reported", parity),
    ]
