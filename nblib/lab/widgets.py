"""ipywidgets panels for live sessions in JupyterLab (`INTERACTIVE = True`), one per notebook's
question. Each callback calls the plain function the batch run calls and shows its result:

  00 matrix_explorer     the matrix by knob and bucket         reproduce.corruption_matrix
  01 page_map            the index-K cache's pages, per replay  canary (pagemap.watch)
  02 gediff_explorer     a design against off, on the protocol  designs.compare, designs.explain
  03 timeline_explorer   one capture's streams, one hazard lit  overlap.audit_model, plots.stream_timeline
  04 fix_explorer        variant by bucket: corruption, speed   fix.run_variant, fix.step_times
  06 report_explorer     one target's audit report              the reports engines.audit_all returned

Each returns a Panel (nblib.lab.panel): show it as a cell's last value; panel.click() runs it. A
run starts from the workload's seed (dev.manual_seed), as the notebook's batch run does, so a choice
shows the same numbers each time it is run and a library call with the same arguments reproduces it.
"""

import html
from collections.abc import Mapping, Sequence
from typing import Any

import ipywidgets as W
import matplotlib.pyplot as plt

from nblib.backends.device import Device
from nblib.core import stats
from nblib.engine.model import INDEX_DTYPES, LOGITS_POLICIES, OVERLAPS
from nblib.engine.runner import MODES
from nblib.instruments import probes
from nblib.instruments.audit.records import TargetReport
from nblib.lab import pagemap
from nblib.lab.panel import Panel
from nblib.publish import plots
from nblib.publish.show import html_table
from nblib.studies import designs, fix, method, overlap, protocol, reproduce

__all__ = [
    "fix_explorer",
    "gediff_explorer",
    "matrix_explorer",
    "method_explorer",
    "page_map",
    "report_explorer",
    "timeline_explorer",
]


def _need(values, what):
    if not values:
        raise ValueError(f"choose at least one {what}")
    return list(values)


def _rate(k, n):
    return stats.fmt_rate(k, n) if n else "no sessions"


def _seeded(dev, workload):
    """The device's RNG (the simulator's replay timing) at the workload's seed."""
    dev.manual_seed(workload.get("seed", 0))


# -- 00 ------------------------------------------------------------------------------------------


def matrix_explorer(
    dev: Device,
    model: dict[str, Any],
    buckets: Sequence[int],
    workload: dict[str, Any],
    logits_policy: str = "transient",
) -> Panel:
    """Corrupted sessions and steps by index dtype x mode x overlap x bucket, for the knobs chosen."""
    p = Panel(
        controls=dict(
            index_dtypes=W.SelectMultiple(
                options=INDEX_DTYPES, value=INDEX_DTYPES, description="index dtype"
            ),
            modes=W.SelectMultiple(options=MODES, value=MODES, description="mode"),
            overlaps=W.SelectMultiple(options=OVERLAPS, value=OVERLAPS, description="overlap"),
            bucket=W.Dropdown(options=sorted(buckets), value=max(buckets), description="up to bucket"),
        ),
        button=W.Button(description="run matrix", button_style="primary"),
    )

    def run(p, tick):
        dtypes, modes = _need(p.value("index_dtypes"), "index dtype"), _need(p.value("modes"), "mode")
        overlaps = _need(p.value("overlaps"), "overlap setting")
        bs = [b for b in sorted(buckets) if b <= p.value("bucket")]
        knobs = reproduce.Knobs(dtypes, modes, overlaps, logits_policy)
        reproduce.check_matrix_args(knobs, bs)
        _seeded(dev, workload)
        tick.start(len(dtypes) * len(modes) * len(overlaps), "capturing the first configuration")
        matrix = reproduce.corruption_matrix(dev, model, bs, workload, knobs, progress=tick)
        rows, aliases = reproduce.with_intervals(matrix.rows), matrix.aliases
        p.state.update(rows=rows, aliases=aliases)
        cols = ["index_dtype", "mode", "overlap", "bucket", "corrupted_sessions", "sessions"]
        cols += ["session_lo", "session_hi", "corrupted_steps", "steps"]
        p.show(
            plots.corruption_heatmap(rows, "session"),
            [
                ("corruption by configuration and bucket", html_table(rows, cols)),
                ("tensors that shared bytes across streams", html_table(aliases)),
            ],
        )
        bad = sum(r["corrupted_sessions"] for r in rows)
        return f"{len(rows)} rows, {bad} corrupted session(s) in all"

    p.on_click(run)
    return p


# -- 01 ------------------------------------------------------------------------------------------


def page_map(
    dev: Device,
    model: dict[str, Any],
    buckets: Sequence[int],
    workload: dict[str, Any],
    logits_policy: str = "transient",
    index_dtype: str = "bf16",
) -> Panel:
    """The canary's run for one overlap setting and bucket; a slider walks its replays' page maps."""
    step = W.IntSlider(value=0, min=0, max=0, description="replay", disabled=True, continuous_update=False)
    p = Panel(
        controls=dict(
            overlap=W.Dropdown(options=OVERLAPS, description="overlap"),
            bucket=W.Dropdown(options=sorted(buckets), value=max(buckets), description="bucket"),
        ),
        button=W.Button(description="watch", button_style="primary"),
        extra=[step],
    )

    def draw(_=None):
        run = p.state.get("run")
        if not run or not run.steps:
            return
        st = run.steps[step.value]
        p.show(pagemap.figure(st))
        p.say(
            f"replay {st.index} of {len(run.steps)}: " + ", ".join(f"{k} {v}" for k, v in st.counts().items())
        )

    def run(p, tick):
        b = p.value("bucket")
        tick.start(pagemap.estimated_steps(workload, b), "capturing")
        _seeded(dev, workload)
        r = pagemap.watch(
            dev, model, buckets, workload, p.value("overlap"), b, index_dtype, logits_policy, tick
        )
        p.state["run"] = r
        alarms = [i for i, s in enumerate(r.steps) if s.counts()["changed"]]
        # open on the first replay worth a look: an alarm, else a corrupted step, else a store
        worth = alarms + [i for i, s in enumerate(r.steps) if s.corrupted_rows or s.counts()["expected"]]
        step.max, step.disabled = max(0, len(r.steps) - 1), not r.steps
        step.value = worth[0] if worth else 0
        draw()
        p.show(tables=[("the canary over this run", html_table([r.summary]))])
        s = r.summary
        return (
            f"{len(r.steps)} replays; corrupted {s['corrupted_sessions']}/{s['sessions']} sessions; "
            f"{s['live_overwrites']} live-page overwrites; {len(alarms)} replay(s) changed an unexpected page"
        )

    p.on_click(run)
    p.watch(step, draw)
    return p


# -- 02 ------------------------------------------------------------------------------------------


def gediff_explorer(
    dev: Device,
    model: dict[str, Any],
    buckets: Sequence[int],
    workload: dict[str, Any],
    logits_policy: str = "transient",
    seed: int = 0,
) -> Panel:
    """One design of the differential (or the canary) against no instrument on the campaign's
    protocol, through designs.compare as notebook 02 runs it: each arm's rate, what it saw, and the
    evidence (aliasing pairs, branch times); a slider walks the design's comparisons."""
    step = W.IntSlider(
        value=0, min=0, max=0, description="comparison", disabled=True, continuous_update=False
    )
    p = Panel(
        controls=dict(
            design=W.Dropdown(options=list(designs.ARMS[1:]), value="campaign", description="design"),
            runs=W.IntSlider(value=2, min=2, max=5, description="runs"),
        ),
        button=W.Button(description="run off and the design", button_style="primary"),
        extra=[step],
    )

    def draw(_=None):
        lines = p.state.get("lines", [])
        step.max, step.disabled = max(0, len(lines) - 1), not lines
        if lines:
            p.say(lines[min(step.value, len(lines) - 1)])

    def run(p, tick):
        arms, seeds = ["off", p.value("design")], protocol.seeds(seed, p.value("runs"))
        tick.start(len(arms) * (len(seeds) + 1), "capturing the first arm")
        result = designs.compare(
            dev, model, buckets, workload, seeds, arms, dict(logits_policy=logits_policy), progress=tick
        )
        why = designs.explain(result)
        rows = [a.model_dump() for a in result.arms]
        mech = [dict(design=a.design, **m.model_dump()) for a in result.arms for m in a.buckets]
        p.state.update(result=result, rows=rows, lines=[x for a in result.arms for x in a.lines])
        p.show(
            plots.design_rates(rows, [f.model_dump() for f in why.findings]),
            [
                ("each arm on the protocol", html_table(rows, designs.COLUMNS)),
                (f"the evidence by bucket ({result.method})", html_table(mech)),
            ],
        )
        step.value = 0
        draw()
        return designs.verdict(result, why)

    p.on_click(run)
    p.watch(step, draw)
    return p


# -- 03 ------------------------------------------------------------------------------------------


def _hazard_label(h):
    r = h.row()
    return (
        f"{r['kind']}: {r['first_op']} ({r['first_stream']}) on {r['first_tensor']} / "
        f"{r['second_op']} ({r['second_stream']}) on {r['second_tensor']}"
    )


def timeline_explorer(
    dev: Device,
    model: dict[str, Any],
    buckets: Sequence[int],
    index_dtypes: Sequence[str] = INDEX_DTYPES,
    overlaps: Sequence[str] = OVERLAPS,
    policies: Sequence[str] = LOGITS_POLICIES,
) -> Panel:
    """Capture and audit one configuration; the chosen bucket's capture is drawn stream by stream,
    and the chosen hazard's two ops are lit, with both tensors' allocation and free sites."""
    hazard = W.Dropdown(options=[], description="hazard", layout=W.Layout(width="95%"), disabled=True)
    shown = W.Dropdown(options=sorted(buckets), value=max(buckets), description="bucket", disabled=True)
    p = Panel(
        controls=dict(
            index_dtype=W.Dropdown(options=index_dtypes, description="index dtype"),
            overlap=W.Dropdown(options=overlaps, description="overlap"),
            policy=W.Dropdown(options=policies, description="logits"),
        ),
        button=W.Button(description="capture + audit", button_style="primary"),
        extra=[W.HBox([shown, hazard])],
    )

    def pick_bucket(_=None):
        rep = p.state.get("report")
        if rep is None:
            return
        seen = {}
        for h in rep.by("bucket").get(shown.value, []):
            seen.setdefault(_hazard_label(h), h)  # one entry per (op pair, tensor pair)
        p.state["hazards"] = list(seen.values())
        hazard.options = [(k, i) for i, k in enumerate(seen)] or [
            ("no cross-stream race in this capture", -1)
        ]
        hazard.disabled = not seen
        hazard.value = 0 if seen else -1
        draw()

    def draw(_=None):
        rep, g = p.state.get("report"), p.state.get("runner")
        if rep is None:
            return
        tr = next(t for t in rep.traces if t.label.get("bucket") == shown.value)
        chosen = [p.state["hazards"][hazard.value]] if hazard.value is not None and hazard.value >= 0 else []
        graph = g.graphs[shown.value][0]
        graph.replay()  # one replay, so the simulator can draw when each op ran
        dev.synchronize()
        title = f"{p.state['knobs']}, bucket {shown.value}: {len(chosen)} hazard lit"
        fig = plots.stream_timeline(tr, chosen, getattr(graph, "last_schedule", None), title=title)
        sites = [chosen[0].row()] if chosen else []
        cols = [
            "first_tensor",
            "first_alloc",
            "first_free",
            "first_site",
            "second_tensor",
            "second_alloc",
            "second_free",
            "second_site",
            "nbytes",
            "reused",
        ]
        p.show(
            fig,
            [
                (
                    "the hazard's tensors: where each was allocated and freed, and the racing ops",
                    html_table(sites, cols),
                )
            ],
        )

    def run(p, tick):
        tick.start(1, "capturing under the recorder")
        rep, runner, seconds = overlap.audit_model(
            dev, model, buckets, p.value("index_dtype"), p.value("overlap"), p.value("policy")
        )
        tick("audited")
        knobs = f"{p.value('index_dtype')}, {p.value('policy')} logits, overlap {p.value('overlap')}"
        p.state.update(report=rep, runner=runner, capture_seconds=seconds, knobs=knobs)
        shown.disabled = False
        pick_bucket()
        return rep.summary()

    p.on_click(run)
    p.watch(shown, pick_bucket)
    p.watch(hazard, draw)
    return p


# -- 04 ------------------------------------------------------------------------------------------


def fix_explorer(
    dev: Device,
    model: dict[str, Any],
    buckets: Sequence[int],
    workload: dict[str, Any],
    replays: int = 20,
    index_dtype: str = "bf16",
) -> Panel:
    """The chosen variants at the chosen buckets: corrupted sessions (Wilson 95%) and step time."""
    names = tuple(fix.VARIANTS)
    p = Panel(
        controls=dict(
            variants=W.SelectMultiple(options=names, value=names, description="variants"),
            buckets=W.SelectMultiple(
                options=sorted(buckets), value=tuple(sorted(buckets)), description="buckets"
            ),
        ),
        button=W.Button(description="run variants", button_style="primary"),
    )

    def run(p, tick):
        variants = _need(p.value("variants"), "variant")
        bs = _need(p.value("buckets"), "bucket")
        tick.start(len(variants) * (len(bs) + 1), "capturing")
        _seeded(dev, workload)
        rows, times = [], []
        for v in variants:
            rows += fix.run_variant(dev, model, bs, workload, v, index_dtype=index_dtype, progress=tick)
        for v in variants:  # one variant per call: the same timing, a tick between variants
            times += fix.step_times(dev, model, bs, [v], replays=replays, index_dtype=index_dtype)
            tick(f"timed {v}")
        p.state.update(rows=rows, times=times)
        ms = {(t["variant"], t["bucket"]): t["median_ms"] for t in times}
        table = [
            dict(
                variant=r["variant"],
                bucket=r["bucket"],
                corrupted=_rate(r["corrupted_sessions"], r["sessions"]),
                median_ms=ms[(r["variant"], r["bucket"])],
            )
            for r in rows
        ]
        p.show(_variant_figure(rows, times, variants), [("variant by bucket", html_table(table))])
        bad = [v for v in variants if any(r["corrupted_sessions"] for r in rows if r["variant"] == v)]
        return f"corrupting: {', '.join(bad) or 'none'}; timing: {times[0]['method']}"

    p.on_click(run)
    return p


def _variant_figure(rows, times, variants):
    fig, (speed, bad) = plt.subplots(1, 2, figsize=(11, 3.8))
    for i, v in enumerate(variants):
        t = sorted((x for x in times if x["variant"] == v), key=lambda x: x["bucket"])
        speed.plot([x["bucket"] for x in t], [x["median_ms"] for x in t], "o-", label=v)
        rs = sorted((r for r in rows if r["variant"] == v), key=lambda r: r["bucket"])
        ci = [stats.rate(r["corrupted_sessions"], r["sessions"]) for r in rs]
        x = [j + (i - (len(variants) - 1) / 2) * 0.1 for j in range(len(rs))]
        bad.errorbar(
            x,
            [c["rate"] for c in ci],
            yerr=[[c["rate"] - c["lo"] for c in ci], [c["hi"] - c["rate"] for c in ci]],
            fmt="o",
            capsize=3,
            label=v,
        )
        bad.set_xticks(range(len(rs)), [str(r["bucket"]) for r in rs])
    speed.set_xscale("log", base=2)
    speed.set(xlabel="bucket", ylabel="decode step, median ms", title="speed")
    bad.set(xlabel="bucket", ylabel="corrupted sessions (Wilson 95%)", title="corruption", ylim=(-0.03, 1.03))
    speed.legend(fontsize=8)
    fig.tight_layout()
    return fig


# -- 06 ------------------------------------------------------------------------------------------


def report_explorer(
    reports: Mapping[tuple[str, str], TargetReport], targets: Sequence[str], backends: Sequence[str]
) -> Panel:
    """The full audit report of the chosen target on the chosen backend, from `reports` (what
    engines.audit_all returned, keyed by (target spec, backend)); redrawn as either control moves."""
    p = Panel(
        controls=dict(
            target=W.Dropdown(options=list(targets), description="target", layout=W.Layout(width="60%")),
            backend=W.Dropdown(options=list(backends), description="backend"),
        ),
        button=None,
    )

    def draw():
        rep = reports[(p.value("target"), p.value("backend"))]
        p.state["report"] = rep
        p.view.value = f"<pre>{html.escape(rep.text())}</pre>"
        p.say(
            f"{rep.target} on {rep.backend}: {rep.status}, {len(rep.hazards)} hazard(s), "
            f"{rep.ops} ops in {rep.captures} capture(s)"
        )

    for name, control in p.controls.items():
        p.watch(control, draw, name)
    draw()
    return p


# -- 07 ------------------------------------------------------------------------------------------


def method_explorer(devices: Mapping[str, Device], replays: int) -> Panel:
    """The whole method on one form of one model, on one backend: the audit with --confirm, then the
    probe differential with the chosen design (nblib.studies.method.run_one, what the batch run
    calls). devices: backend name -> device facade."""
    p = Panel(
        controls=dict(
            model=W.Dropdown(options=list(method.MODELS), description="model"),
            form=W.Dropdown(options=list(method.FORMS), description="form"),
            design=W.Dropdown(options=list(probes.DESIGNS), description="probes"),
            backend=W.Dropdown(options=list(devices), description="backend"),
            replays=W.BoundedIntText(value=replays, min=1, max=200, description="replays"),
        ),
        button=W.Button(description="run the method", button_style="primary", layout=W.Layout(width="auto")),
    )
    p.figure.layout.display = "none"  # a table, no figure

    def run(p, tick):
        tick.start(1, "capturing")
        row = method.run_one(
            devices[p.value("backend")],
            p.value("model"),
            p.value("form"),
            p.value("replays"),
            p.value("design"),
        )
        tick()
        p.state["row"] = row
        shown = row.model_dump(exclude={"target", "model", "form", "backend"})
        p.show(None, [(f"{row.target} on {row.backend}", html_table([shown]))])
        return (
            f"{row.target} on {row.backend}: {row.hazards} hazard(s), {row.confirmed} confirmed; forced "
            f"{row.forced}, natural {row.natural}, with probes ({row.design}) {row.probed}"
        )

    p.on_click(run)
    return p
