"""Figures for the notebooks; each returns a matplotlib Figure and saves nothing by itself."""

import matplotlib.pyplot as plt


def corruption_heatmap(rows, level="session"):
    """One line per (index dtype, mode, overlap), one column per bucket: the corrupted fraction,
    annotated with k/n. Clean cells are white, so the fingerprint reads at a glance."""
    configs = sorted({(r["index_dtype"], r["mode"], r["overlap"]) for r in rows})
    buckets = sorted({r["bucket"] for r in rows})
    key_k, key_n = ("corrupted_sessions", "sessions") if level == "session" else ("corrupted_steps", "steps")
    grid = [[float("nan")] * len(buckets) for _ in configs]
    fig, ax = plt.subplots(figsize=(1.2 * len(buckets) + 3, 0.5 * len(configs) + 1.5))
    for r in rows:
        i, j = configs.index((r["index_dtype"], r["mode"], r["overlap"])), buckets.index(r["bucket"])
        grid[i][j] = r[key_k] / r[key_n] if r[key_n] else float("nan")
        ax.text(j, i, f"{r[key_k]}/{r[key_n]}", ha="center", va="center", fontsize=8)
    im = ax.imshow(grid, cmap="Reds", vmin=0, vmax=1, aspect="auto")
    ax.set_xticks(range(len(buckets)), [str(b) for b in buckets])
    ax.set_yticks(range(len(configs)), [f"{d} {m} overlap {o}" for d, m, o in configs])
    ax.set_xlabel("decode batch size (bucket)")
    ax.set_title(f"corrupted {level}s")
    fig.colorbar(im, ax=ax, label=f"fraction of {level}s corrupted")
    fig.tight_layout()
    return fig


def stream_timeline(trace, hazards=(), schedule=None, title=None):
    """The captured ops of one capture (nblib.instruments.trace.CaptureTrace) as bars, one lane per stream.
    schedule: (starts, ends) by op index, e.g. a sim graph's last_schedule after a replay (seconds);
    without one the x axis is the capture order. Ops in a hazard are red, joined by a dashed line."""
    ops = trace.ops
    streams = sorted({op.stream for op in ops}, key=lambda s: (s != "main", s))
    lane = {s: i for i, s in enumerate(streams)}
    if schedule is not None:
        scale = 1e6
        span = [
            (schedule[0][op.index] * scale, (schedule[1][op.index] - schedule[0][op.index]) * scale)
            for op in ops
        ]
        xlabel = "simulated time in one replay (us)"
    else:
        span = [(i, 0.9) for i in range(len(ops))]
        xlabel = "capture order (op)"
    at = {op.index: (x, w) for op, (x, w) in zip(ops, span)}
    bad = {h.first.index for h in hazards} | {h.second.index for h in hazards}
    fig, ax = plt.subplots(figsize=(11, 0.9 * len(streams) + 1.6))
    for op, (x, w) in zip(ops, span):
        ax.barh(
            lane[op.stream],
            w,
            left=x,
            height=0.6,
            color="tab:red" if op.index in bad else "tab:blue",
            edgecolor="white",
            linewidth=0.5,
        )
    for h in {(h.first.index, h.second.index): h for h in hazards}.values():
        (x1, w1), (x2, w2) = at[h.first.index], at[h.second.index]
        ax.plot(
            [x1 + w1 / 2, x2 + w2 / 2],
            [lane[h.first.stream], lane[h.second.stream]],
            "--",
            color="tab:red",
            linewidth=1,
        )
    for op, (x, w) in zip(ops, span):
        if op.index in bad:
            ax.annotate(
                op.name.split("::")[-1],
                (x + w / 2, lane[op.stream] + 0.33),
                ha="center",
                fontsize=7,
                color="tab:red",
            )
    ax.set_yticks(range(len(streams)), streams)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title or f"{trace.title()}: {len(hazards)} hazard(s) (red)")
    fig.tight_layout()
    return fig


def step_times(times, variants=None):
    """Decode-step time per bucket, one line per variant (median, quartiles as a band)."""
    variants = variants or list(dict.fromkeys(t["variant"] for t in times))
    fig, ax = plt.subplots(figsize=(7, 4))
    for v in variants:
        rs = sorted((t for t in times if t["variant"] == v), key=lambda t: t["bucket"])
        b = [r["bucket"] for r in rs]
        ax.plot(b, [r["median_ms"] for r in rs], "o-", label=v)
        ax.fill_between(b, [r["q1_ms"] for r in rs], [r["q3_ms"] for r in rs], alpha=0.2)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("decode batch size (bucket)")
    ax.set_ylabel(f"step time, ms ({rs[0]['method'] if rs else ''})")
    ax.set_title("decode step (graph replay), median and quartiles")
    ax.legend()
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


def design_rates(arms, findings=None):
    """The corruption rate per arm with its Wilson interval (off first), each labelled with what
    the differential saw and, from findings, the effect and why."""
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
            label += f"  ({why[a['design']]['effect']})"
        ax.text(1.02, y, label, transform=ax.get_yaxis_transform(), va="center", fontsize=8)
    if off is not None:
        ax.axvline(off["rate"], color="dimgray", linestyle=":", linewidth=1)
    ax.set_yticks(ys, names)
    ax.set_xlim(0, 1)
    ax.set_xlabel("sessions corrupted (Wilson 95%); red raises, blue lowers, grey: no change detected")
    ax.set_title("the differential's designs on the campaign's protocol", fontsize=10)
    fig.tight_layout()
    return fig
