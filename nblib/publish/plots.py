"""Figures for the notebooks; each returns a matplotlib Figure and saves nothing by itself.

Every figure is drawn to be read where the site shows it (about 1000 px wide, saved at DPI): no
two labels overlap, none leaves the canvas, and text on a coloured cell takes the ink (black or
white) with the higher WCAG contrast against that cell. tests/test_figures.py checks all three."""

import matplotlib.pyplot as plt
from matplotlib.colors import to_rgb

from nblib.publish.caveats import timing_label

DPI = 120  # what the notebooks save at; the tests render at the same
HAZARD = "#c0161c"  # the racing ops: a red that keeps 4.5:1 against white for its labels
OP = "#7ea6cf"  # every other op: light, so the two racing ops stand out


def _luminance(colour):
    """WCAG 2.x relative luminance of a matplotlib colour."""
    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in to_rgb(colour)]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def ink(background):
    """Black or white, whichever contrasts more with `background` (WCAG: (L1 + .05) / (L2 + .05))."""
    lum = _luminance(background)
    return "black" if (lum + 0.05) / 0.05 >= 1.05 / (lum + 0.05) else "white"


def corruption_heatmap(rows, level="session"):
    """One line per (index dtype, mode, overlap), one column per bucket: the corrupted fraction,
    annotated with k/n ("none" where no step filled the bucket). Clean cells are near white, so the
    fingerprint reads at a glance; each count is inked black or white against its cell."""
    configs = sorted({(r["index_dtype"], r["mode"], r["overlap"]) for r in rows})
    buckets = sorted({r["bucket"] for r in rows})
    key_k, key_n = ("corrupted_sessions", "sessions") if level == "session" else ("corrupted_steps", "steps")
    grid = [[float("nan")] * len(buckets) for _ in configs]
    fig, ax = plt.subplots(figsize=(1.2 * len(buckets) + 3.4, max(3.0, 0.5 * len(configs) + 1.5)))
    cmap = plt.get_cmap("Reds")
    for r in rows:
        i, j = configs.index((r["index_dtype"], r["mode"], r["overlap"])), buckets.index(r["bucket"])
        frac = r[key_k] / r[key_n] if r[key_n] else None
        grid[i][j] = float("nan") if frac is None else frac
        cell = "white" if frac is None else cmap(frac)
        text = f"{r[key_k]}/{r[key_n]}" if r[key_n] else "none"
        ax.text(j, i, text, ha="center", va="center", fontsize=8, color=ink(cell))
    im = ax.imshow(grid, cmap=cmap, vmin=0, vmax=1, aspect="auto")
    ax.set_xticks(range(len(buckets)), [str(b) for b in buckets])
    ax.set_yticks(range(len(configs)), [f"{d} {m} overlap {o}" for d, m, o in configs])
    ax.set_xlabel("decode batch size (bucket)")
    ax.set_title(f"corrupted {level}s (none: no step filled the bucket)", fontsize=10)
    fig.colorbar(im, ax=ax, label=f"fraction of {level}s corrupted")
    fig.tight_layout()
    return fig


def step_times(times, variants=None):
    """Decode-step time per bucket, one line per variant (median, quartiles as a band). How the
    times were taken (CUDA events, or the simulator's timing model) is said under the axis."""
    variants = variants or list(dict.fromkeys(t["variant"] for t in times))
    fig, ax = plt.subplots(figsize=(8, 4.4))
    colours = plt.get_cmap("tab10").colors
    for i, v in enumerate(variants):
        rs = sorted((t for t in times if t["variant"] == v), key=lambda t: t["bucket"])
        b = [r["bucket"] for r in rs]
        c = colours[i % len(colours)]
        ax.plot(b, [r["median_ms"] for r in rs], "o-", label=v, color=c)
        ax.fill_between(b, [r["q1_ms"] for r in rs], [r["q3_ms"] for r in rs], alpha=0.2, color=c)
    ax.set_xscale("log", base=2)
    buckets = sorted({t["bucket"] for t in times})
    ax.set_xticks(buckets, [str(b) for b in buckets])
    ax.minorticks_off()
    method = times[0]["method"] if times else ""
    ax.set_xlabel(f"decode batch size (bucket)\n{timing_label(method)}")
    ax.set_ylabel("step time (ms)")
    ax.set_title("decode step (graph replay): median, quartiles shaded", fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def _spans(ops, schedule):
    """{op index: (x, width)}: simulated microseconds of one replay, or the capture order."""
    if schedule is None:
        return {op.index: (i, 0.9) for i, op in enumerate(ops)}, "capture order (op)"
    starts, ends = schedule[0], schedule[1]
    at = {op.index: (starts[op.index] * 1e6, (ends[op.index] - starts[op.index]) * 1e6) for op in ops}
    return at, "simulated time in one replay (us, the simulator's timing model)"


def _together(h, at):
    """How long the hazard's two ops ran at the same time in the drawn replay (x units)."""
    (x1, w1), (x2, w2) = at[h.first.index], at[h.second.index]
    return max(0.0, min(x1 + w1, x2 + w2) - max(x1, x2))


def worst_hazard(hazards, at):
    """The index of the hazard to draw: a reused block first (a free, then another tensor in its
    bytes: the bug's kind), then the longest time its two ops ran together in the drawn replay,
    then the most bytes."""
    return max(
        range(len(hazards)),
        key=lambda i: (hazards[i].reused, _together(hazards[i], at), hazards[i].nbytes, -i),
    )


def _op_label(ax, op, tensor, x, lane, top):
    """The op's name and tensor beside its bar, outside the lane (above the top lane, below any
    other), aligned so it stays inside the axes."""
    lo, hi = ax.get_xlim()
    frac = (x - lo) / (hi - lo)
    ha = "left" if frac < 0.2 else "right" if frac > 0.8 else "center"
    y = lane - 0.36 if top else lane + 0.36
    ax.text(
        x, y, f"{op.name.split('::')[-1]} ({op.stream}): {tensor}", ha=ha,
        va="bottom" if top else "top", fontsize=9, color=HAZARD,
    )  # fmt: skip


def _hazard_line(h, row, hazards, pick, at, schedule):
    """The title's second line: which hazard is red, what it is (row: its HazardRow), and how many the
    table holds."""
    if len(hazards) == 1:
        which = "the one hazard"
    else:
        which = (
            f"the worst of {len(hazards)} hazards" if pick is None else f"hazard {pick + 1} of {len(hazards)}"
        )
    line = f"red: {which}, {row.kind} on {row.nbytes:,} bytes"
    if schedule is not None:
        t = _together(h, at)
        line += f", ran together {t:.1f} us" if t else ", not overlapping in this replay"
    rest = len(hazards) - 1
    return line + (f"; {rest} more in the audit's table" if rest else "")


def stream_timeline(trace, hazards=(), schedule=None, title=None, pick=None):
    """The captured ops of one capture (nblib.instruments.audit.trace.CaptureTrace) as bars, one lane per
    stream, and ONE hazard drawn: its two ops in red, joined by an arrow, each named with its tensor.
    pick: the index in `hazards` to draw (default: worst_hazard); the title counts the rest, which
    the audit's table lists. schedule: (starts, ends) by op index, e.g. a sim graph's last_schedule
    after a replay (seconds); without one the x axis is the capture order."""
    ops = trace.ops
    streams = sorted({op.stream for op in ops}, key=lambda s: (s != "main", s))
    lane = {s: i for i, s in enumerate(streams)}
    at, xlabel = _spans(ops, schedule)
    hazards = list(hazards)
    h = hazards[worst_hazard(hazards, at) if pick is None else pick] if hazards else None
    lit = {h.first.index, h.second.index} if h else set()
    fig, ax = plt.subplots(figsize=(11, 1.0 * len(streams) + 1.9))
    for op in ops:
        x, w = at[op.index]
        colour = HAZARD if op.index in lit else OP
        ax.barh(lane[op.stream], w, left=x, height=0.5, color=colour, edgecolor="white", linewidth=0.4)
    ax.set_ylim(len(streams) - 0.4, -0.6)  # inverted: main on top, room for a label above and below
    ax.set_yticks(range(len(streams)), streams)
    ax.set_xlabel(xlabel)
    end = max(x + w for x, w in at.values()) if at else 1.0
    ax.set_xlim(0, end * 1.01)
    head = title or trace.title()
    if h is None:
        ax.set_title(f"{head}\nno cross-stream hazard in this capture", fontsize=10)
    else:
        row = h.fields()
        (x1, w1), (x2, w2) = at[h.first.index], at[h.second.index]
        y1, y2 = lane[h.first.stream], lane[h.second.stream]
        ax.annotate(
            "", xy=(x2 + w2 / 2, y2), xytext=(x1 + w1 / 2, y1),
            arrowprops=dict(arrowstyle="->", color=HAZARD, linestyle="--", linewidth=1.2),
        )  # fmt: skip
        for op, tensor, x, w in (
            (h.first, row.first_tensor, x1, w1),
            (h.second, row.second_tensor, x2, w2),
        ):
            _op_label(ax, op, tensor, x + w / 2, lane[op.stream], lane[op.stream] == 0)
        ax.set_title(f"{head}\n{_hazard_line(h, row, hazards, pick, at, schedule)}", fontsize=10)
    fig.tight_layout()
    return fig


def race_window(steps, index_dtype="bf16"):
    """Every step replayed with overlap on, by the longest context in its batch (x) and its bucket
    (y, jittered within a band), red when any of its rows corrupted. If the window decides the
    race, each bucket's red points sit to the right of an edge: the side branch (indexer over the
    longest request, then top-k) outlasts the main branch's lead only on long steps."""
    sel = [s for s in steps if s["index_dtype"] == index_dtype]
    buckets = sorted({s["bucket"] for s in sel})
    fig, ax = plt.subplots(figsize=(9, 0.6 * len(buckets) + 1.6))
    for j, b in enumerate(buckets):
        mine = [s for s in sel if s["bucket"] == b]
        for bad, color, label in ((False, "#9ab", "clean step"), (True, "#d22", "corrupted step")):
            pts = [s for s in mine if bool(s["bad_rows"]) == bad]
            ys = [j + 0.6 * ((i * 0.618) % 1 - 0.5) for i in range(len(pts))]
            ax.scatter([s["ctx_max"] for s in pts], ys, s=9, c=color, label=label if j == 0 else None)
    ax.set_yticks(range(len(buckets)), [f"bucket {b}" for b in buckets])
    ax.set_xlabel("longest context in the batch (compressed index entries)")
    ax.set_title(f"{index_dtype}, graph, overlap on: which steps corrupted")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    return fig


def protocol_runs(proto, title="the campaign's protocol"):
    """One bar per run (its share of sessions corrupted, k/n above it), the pooled rate as a line
    with its Wilson 95% band: whether the runs agree is visible at a glance."""
    runs = proto["runs"]
    pooled = proto["pooled"]
    fig, ax = plt.subplots(figsize=(1.0 * len(runs) + 5.0, 3.4))
    xs = range(len(runs))
    rates = [r["corrupted_sessions"] / r["sessions"] if r["sessions"] else 0.0 for r in runs]
    ax.axhspan(pooled["lo"], pooled["hi"], color="tab:orange", alpha=0.18, label="pooled, Wilson 95%")
    ax.axhline(pooled["rate"], color="tab:orange", linewidth=1.5)
    ax.bar(xs, rates, color="tab:red", width=0.6, label="one run")
    for x, r, v in zip(xs, runs, rates):
        ax.text(
            x, v + 0.01, f"{r['corrupted_sessions']}/{r['sessions']}", ha="center", va="bottom", fontsize=8
        )
    ax.set_xticks(list(xs), [f"seed {r['seed']}" for r in runs])
    top = max([*rates, pooled["hi"]])
    ax.set_ylim(0, top + 0.12)  # headroom for the k/n labels above the bars
    ax.set_yticks([t for t in ax.get_yticks() if 0 <= t <= 1])
    ax.set_ylabel("sessions corrupted")
    ax.set_title(f"{title}: dispersion p = {proto['dispersion_p']:.2g}", fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def seed_blocks(blocks, title="the protocol from each seed block"):
    """One column per seed block (protocol.Block): a dot per run (its share of sessions corrupted),
    the block's pooled rate with its Wilson 95% interval beside them: whether the blocks agree,
    and whether a block's runs do, at a glance."""
    fig, ax = plt.subplots(figsize=(1.6 * len(blocks) + 3.0, 3.4))
    for x, b in enumerate(blocks):
        rates = [r.corrupted_sessions / r.sessions if r.sessions else 0.0 for r in b.runs]
        jitter = [x - 0.15 + 0.3 * i / max(1, len(rates) - 1) for i in range(len(rates))]
        ax.scatter(jitter, rates, color="tab:red", s=18, zorder=3, label="one run" if x == 0 else None)
        p = b.pooled
        ax.errorbar(x + 0.3, p.rate, yerr=[[p.rate - p.lo], [p.hi - p.rate]], fmt="s", color="tab:orange",
                    capsize=4, label="pooled, Wilson 95%" if x == 0 else None)  # fmt: skip
        ax.text(x + 0.3, p.hi + 0.02, f"{p.corrupted_sessions}/{p.sessions}", ha="center", fontsize=8)
    ax.set_xticks(
        range(len(blocks)), [f"seeds {b.base_seed}-{b.base_seed + len(b.runs) - 1}" for b in blocks]
    )
    ax.set_xlim(-0.6, len(blocks) - 0.2)
    ax.set_ylim(0, 1.14)  # headroom for the k/n labels
    ax.set_yticks([0, 0.25, 0.5, 0.75, 1.0])
    ax.set_ylabel("sessions corrupted")
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def bucket_steps(rows, title="steps by bucket, pooled over the runs"):
    """Per bucket (protocol.bucket_rows): the share of its replayed steps that corrupted, with the
    Wilson 95% interval, and k/n beside each point: which buckets carry the race, and whether the
    kernels' timing decides it step by step (a rate between 0 and 1) or the bucket alone (0 or 1)."""
    fig, ax = plt.subplots(figsize=(7.5, 0.45 * len(rows) + 1.4))
    ys = list(range(len(rows)))[::-1]
    for y, r in zip(ys, rows):
        colour = "tab:red" if r["corrupted_steps"] else "dimgray"
        ax.errorbar(r["step_rate"], y, xerr=[[r["step_rate"] - r["lo"]], [r["hi"] - r["step_rate"]]],
                    fmt="o", color=colour, capsize=3)  # fmt: skip
        ax.text(1.04, y, f"{r['corrupted_steps']}/{r['steps']} steps", va="center", fontsize=8)
    ax.set_yticks(ys, [f"bucket {r['bucket']}" for r in rows])
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_xlabel("steps corrupted (Wilson 95%)")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def design_rates(arms, findings=None):
    """The corruption rate per arm with its Wilson interval (off first), each labelled with what
    the differential saw and, from findings, the effect and the mechanism that carries it."""
    why = {f["design"]: f for f in findings or []}
    names = [a["design"] for a in arms]
    off = next((a for a in arms if a["design"] == "off"), None)
    fig, ax = plt.subplots(figsize=(9, 0.62 * len(arms) + 1.4))
    ys = list(range(len(arms)))[::-1]
    for y, a in zip(ys, arms):
        colour = {"raises": "tab:red", "lowers": "tab:blue"}.get(
            why.get(a["design"], {}).get("effect"), "dimgray"
        )
        ax.errorbar(
            a["rate"],
            y,
            xerr=[[a["rate"] - a["lo"]], [a["hi"] - a["rate"]]],
            fmt="o",
            color=colour,
            capsize=3,
        )
        seen = f", diverged {a['diverged']}/{a['comparisons']}" if a["comparisons"] else ""
        label = f"{a['corrupted_sessions']}/{a['sessions']}{seen}"
        if a["design"] in why:
            f = why[a["design"]]
            label += f"  ({f['effect']}" + (
                f", {f['mechanism']})" if f.get("mechanism", "none") != "none" else ")"
            )
        ax.text(1.02, y, label, transform=ax.get_yaxis_transform(), va="center", fontsize=8)
    if off is not None:
        ax.axvline(off["rate"], color="dimgray", linestyle=":", linewidth=1)
    ax.set_yticks(ys, names)
    ax.set_xlim(0, 1)
    ax.set_xlabel("sessions corrupted (Wilson 95%); red raises, blue lowers, grey: no change detected")
    ax.set_title("the differential's designs on the campaign's protocol", fontsize=10)
    fig.tight_layout()
    return fig
