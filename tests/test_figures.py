"""Every figure legible where the site shows it: drawn at the notebooks' DPI and read at 1000 px
wide, no two text boxes overlap, no text leaves the canvas, every text keeps a WCAG 2.x contrast of
4.5:1 against what is drawn under it (a count on a dark cell included), no legend hides a data
point, and no two series share a colour and a marker. Each figure is rendered from results the
suite committed (outputs/gpu, outputs/sim), from captures made here on the simulator, from the ci
suite's own results, and from synthetic rows that push a figure to its limits."""

import json
from pathlib import Path
from typing import NamedTuple
from unittest import mock

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_rgba
from matplotlib.text import Text

from nblib.backends import device
from nblib.core.paths import ROOT
from nblib.publish import plots
from nblib.run import sweep, sweep_table
from nblib.schema import params as P
from nblib.studies import overlap, protocol

SHOWN_PX = 1000  # the width a figure is read at (the site scales wider images down, never up)
MIN_FONT_PX = 9.0  # the smallest text height a reader can be asked to read at that width
MIN_CONTRAST = 4.5  # WCAG 2.x, level AA, normal text
RUNS = [ROOT / "outputs" / "gpu", ROOT / "outputs" / "sim"]


class Drawn(NamedTuple):
    text: str
    box: object  # display-space Bbox, pixels
    colour: tuple  # RGBA
    size_px: float  # font size in pixels at the figure's DPI


def luminance(rgb):
    """WCAG 2.x relative luminance of sRGB values in [0, 1]."""
    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb[:3]]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def contrast(a, b):
    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def drawn_texts(fig):
    """Every text the figure actually draws (tick labels, titles, legend entries, annotations),
    with its box after the draw: Text.draw is wrapped, so a label matplotlib skips is not counted."""
    seen = []
    draw = Text.draw

    def spy(self, renderer):
        draw(self, renderer)
        if self.get_visible() and self.get_text().strip():
            seen.append(self)

    with mock.patch.object(Text, "draw", spy):
        fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    return [
        Drawn(
            t.get_text(), t.get_window_extent(renderer), to_rgba(t.get_color(), t.get_alpha()), t.get_size()
        )
        for t in seen
    ], seen


def backgrounds(fig, artists, boxes):
    """The median colour under each text box, drawn with every text hidden."""
    for a in artists:
        a.set_visible(False)
    fig.canvas.draw()
    pixels = np.asarray(fig.canvas.buffer_rgba())[..., :3] / 255.0
    for a in artists:
        a.set_visible(True)
    h = pixels.shape[0]
    out = []
    for b in boxes:
        rows = slice(max(0, int(h - b.y1)), max(1, int(np.ceil(h - b.y0))))
        cols = slice(max(0, int(b.x0)), max(1, int(np.ceil(b.x1))))
        patch = pixels[rows, cols].reshape(-1, 3)
        out.append(np.median(patch, axis=0) if len(patch) else np.ones(3))
    return out


def problems(fig, dpi=plots.DPI):
    """Everything that makes the figure hard to read; empty when it reads well."""
    fig.set_dpi(dpi)
    texts, artists = drawn_texts(fig)
    width, height = fig.canvas.get_width_height()
    scale = min(1.0, SHOWN_PX / width)
    out = []
    for t in texts:
        b = t.box
        if b.x0 < -0.5 or b.y0 < -0.5 or b.x1 > width + 0.5 or b.y1 > height + 0.5:
            out.append(f"outside the canvas ({width}x{height}): {t.text!r} at {b.bounds}")
        px = t.size_px * dpi / 72 * scale
        if px < MIN_FONT_PX:
            out.append(f"{px:.1f} px high at {SHOWN_PX} px wide: {t.text!r}")
    for i, a in enumerate(texts):
        for b in texts[i + 1 :]:
            w = min(a.box.x1, b.box.x1) - max(a.box.x0, b.box.x0)
            h = min(a.box.y1, b.box.y1) - max(a.box.y0, b.box.y0)
            if w > 1 and h > 1:
                out.append(f"overlap: {a.text!r} and {b.text!r}")
    for t, bg in zip(texts, backgrounds(fig, artists, [t.box for t in texts])):
        c = contrast(t.colour, bg)
        if c < MIN_CONTRAST:
            out.append(
                f"contrast {c:.2f} < {MIN_CONTRAST}: {t.text!r} ({t.colour[:3]} on {tuple(bg.round(2))})"
            )
    return out + hidden_points(fig)


def hidden_points(fig):
    """Data points (markers) under a legend box."""
    renderer = fig.canvas.get_renderer()
    out = []
    for ax in fig.axes:
        legends = [lg for lg in [ax.get_legend(), *fig.legends] if lg is not None]
        for lg in legends:
            box = lg.get_window_extent(renderer)
            for line in ax.get_lines():
                if line.get_marker() in (None, "None", "", " "):
                    continue
                xy = ax.transData.transform(np.column_stack(line.get_data()).astype(float))
                inside = [p for p in xy if box.contains(*p)]
                if inside:
                    out.append(f"the legend hides {len(inside)} point(s) of {line.get_label()!r}")
    return out


def series_styles(fig):
    """(colour, marker) of every labelled series, to find two drawn alike."""
    styles = []
    for ax in fig.axes:
        for h in ax.get_legend_handles_labels()[0]:
            line = h.lines[0] if hasattr(h, "lines") else h  # an errorbar's data line
            styles.append((to_rgba(line.get_color()), line.get_marker()))
    return styles


def check(fig):
    try:
        assert problems(fig) == []
    finally:
        plt.close(fig)


def results(run, notebook):
    path = run / f"{notebook}.results.json"
    if not path.exists():
        pytest.skip(f"{path} is not in this checkout")
    return json.loads(path.read_text())


# -- the checks themselves must be able to fail -------------------------------------------------


def test_the_checks_catch_overlap_escape_low_contrast_tiny_text_and_a_covering_legend():
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.imshow([[1.0]], cmap="Reds", vmin=0, vmax=1)
    ax.text(0, 0, "black on dark red", color="black", ha="center")
    ax.text(0, 0.3, "overlapping", ha="center")
    ax.text(0, 0.32, "overlapping", ha="center")
    ax.text(5, 0, "far outside the canvas", transform=ax.transAxes)
    ax.plot([0], [0], "o", label="a point")
    ax.legend(loc="center")
    fig.text(0.5, 0.5, "tiny", fontsize=3)
    found = "\n".join(problems(fig))
    plt.close(fig)
    for what in ("contrast", "overlap", "outside the canvas", "px high", "the legend hides"):
        assert what in found, what


def test_wcag_luminance_matches_the_standard_values():
    assert contrast((0, 0, 0), (1, 1, 1)) == pytest.approx(21.0)
    assert contrast(to_rgba("#777777"), (1, 1, 1)) == pytest.approx(4.48, abs=0.01)
    assert plots.ink(plt.get_cmap("Reds")(1.0)) == "white" and plots.ink("white") == "black"


# -- notebook 00 ---------------------------------------------------------------------------------


@pytest.mark.parametrize("run", RUNS, ids=lambda r: r.name)
@pytest.mark.parametrize("level", ["session", "step"])
def test_the_matrix_heatmap(run, level):
    check(plots.corruption_heatmap(results(run, "00_reproduce")["matrix"], level))


def test_the_heatmap_inks_every_count_against_its_cell():
    rows = [
        dict(index_dtype="bf16", mode="graph", overlap="on", bucket=b, corrupted_sessions=k, sessions=n)
        for b, (k, n) in zip([1, 8, 24, 40, 48], [(0, 40), (10, 40), (30, 40), (40, 40), (0, 0)])
    ]
    check(plots.corruption_heatmap(rows))


@pytest.mark.parametrize("run", RUNS, ids=lambda r: r.name)
def test_the_protocol_and_the_race_window(run):
    res = results(run, "00_reproduce")
    check(plots.protocol_runs(res["protocol"], "bf16 + graph + overlap on"))
    check(plots.race_window(res["window_steps"]))


# -- notebook 02 ---------------------------------------------------------------------------------


@pytest.mark.parametrize("run", RUNS, ids=lambda r: r.name)
def test_the_designs(run):
    res = results(run, "02_graph_vs_eager")
    check(plots.design_rates([res["off"], *res["designs"]], res["explanation"]["findings"]))


# -- notebook 03 ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def captures():
    """The racing configuration's largest bucket, captured and audited on the simulator, on the
    sim profile (the MLP in the freed block: a few hazards) and the ci profile (the trunk's
    transients in it: dozens), each replayed once for its schedule."""
    dev = device.get("sim")
    out = {}
    for name, bucket in (("sim", 40), ("ci", 8)):
        dev.manual_seed(0)
        model = P.load(ROOT / "params" / f"{name}.yaml")["model"]
        rep, runner, _ = overlap.audit_model(dev, model, [bucket], "bf16", "on", "transient")
        graph = runner.graphs[bucket][0]
        graph.replay()
        dev.synchronize()
        out[name] = (rep, graph.last_schedule)
    return out


@pytest.mark.parametrize("profile", ["sim", "ci"])
@pytest.mark.parametrize("timed", [True, False], ids=["simulated time", "capture order"])
def test_the_stream_timeline_draws_one_hazard_readably(captures, profile, timed):
    rep, schedule = captures[profile]
    assert rep.hazards, "the racing configuration has hazards to draw"
    fig = plots.stream_timeline(rep.traces[0], rep.hazards, schedule if timed else None, title="bf16")
    red = [p for p in fig.axes[0].patches if to_rgba(p.get_facecolor()) == to_rgba(plots.HAZARD)]
    assert len(red) == 2  # one hazard's two ops, however many the capture holds
    assert f"of {len(rep.hazards)} hazards" in fig.axes[0].get_title()
    check(fig)


def test_the_timeline_draws_the_hazard_picked(captures):
    rep, schedule = captures["ci"]
    fig = plots.stream_timeline(rep.traces[0], rep.hazards, schedule, title="bf16", pick=len(rep.hazards) - 1)
    assert f"hazard {len(rep.hazards)} of {len(rep.hazards)}" in fig.axes[0].get_title()
    check(fig)


# -- notebook 04 ---------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["cuda events", "simulated events"])
def test_the_step_times_keep_their_labels_on_the_canvas(method):
    times = [dict(t, method=method) for t in results(RUNS[0], "04_persistent_buffer_fix")["times"]]
    fig = plots.step_times(times)
    assert ("simulated" in fig.axes[0].get_xlabel()) == (method != "cuda events")
    check(fig)


# -- sweeps --------------------------------------------------------------------------------------


def knobs_sweep(notebooks=("00_reproduce",)):
    """The knobs grid (12 series on notebook 00: seeds x buckets x index dtype), every point
    corrupting near the top of the axis, where a legend inside the panel would sit."""
    g = sweep.Grid(
        notebooks=notebooks,
        keys=("seed", "buckets", "logits_policy", "index_dtypes", "modes"),
        values=(
            [0, 1, 2],
            [[1, 2], [1, 8]],
            ["transient", "record_stream"],
            [["bf16"], ["fp8"]],
            [["graph"]],
        ),
        x="logits_policy",
        name="knobs",
    )
    profile = P.load(ROOT / "params" / "ci.yaml")
    rows = []
    for i, (s, b, lp, d) in enumerate(np.ndindex(3, 2, 2, 2)):
        values = dict(seed=s, buckets=[[1, 2], [1, 8]][b], logits_policy=["transient", "record_stream"][lp])
        values |= dict(index_dtypes=[["bf16"], ["fp8"]][d], modes=["graph"])
        shown = {key: sweep_table._shown(v) for key, v in values.items()}
        for n in notebooks:
            k = 38 - i % 5
            rows.append(
                dict(
                    point=f"p{i}", notebook=n, status="ok", **shown,
                    arm=f"{values['index_dtypes'][0]} graph overlap on", corrupted_sessions=k, sessions=40,
                    rate=k / 40, lo=k / 40 - 0.1, hi=min(1.0, k / 40 + 0.05),
                    cannot_show="; ".join(sweep_table.cannot_show(n, {**profile, **values})),
                )
            )  # fmt: skip
    return pd.DataFrame(rows), g


def test_a_point_without_eager_mode_reports_its_rate_not_a_fingerprint():
    profile = {**P.load(ROOT / "params" / "ci.yaml"), "modes": ["graph"]}
    missing = sweep_table.cannot_show("00_reproduce", profile)
    assert missing == ["the eager clean check"]
    verdict = "fingerprint NOT reproduced: corrupted sessions nowhere."
    text = sweep_table._verdict("00_reproduce", verdict, {"bf16 graph overlap on": (3, 16)}, missing)
    assert "fingerprint" not in text and "3/16" in text and "eager clean check" in text
    assert sweep_table.cannot_show("00_reproduce", P.load(ROOT / "params" / "ci.yaml")) == []


def test_the_sweep_figure_gives_every_series_its_own_look_and_hides_no_point():
    df, g = knobs_sweep()
    fig = sweep_table.figure(df, g)
    styles = series_styles(fig)
    assert len(styles) == 12 and len(set(styles)) == 12
    title = fig.axes[0].get_title().replace("\n", " ")
    assert "no point tests the eager clean check" in title  # the grid runs graph mode only
    check(fig)


def test_a_sweep_of_the_whole_suite_stays_readable():
    df, g = knobs_sweep(
        notebooks=("00_reproduce", "01_canary", "02_graph_vs_eager", "04_persistent_buffer_fix")
    )
    check(sweep_table.figure(df, g))


# -- the ci suite's own figures ------------------------------------------------------------------


def test_every_figure_of_the_ci_suite(ci_suite):
    """The figures the ci suite's notebooks saved, redrawn from their results.json."""
    r0 = json.loads((ci_suite / "00_reproduce.results.json").read_text())
    r2 = json.loads((ci_suite / "02_graph_vs_eager.results.json").read_text())
    r4 = json.loads((ci_suite / "04_persistent_buffer_fix.results.json").read_text())
    for name in (
        "00_protocol",
        "00_bucket_steps",
        "00_matrix_sessions",
        "00_race_window",
        "02_designs",
        "03_timeline",
        "04_step_times",
    ):
        assert (ci_suite / f"{name}.png").exists(), name
    check(plots.corruption_heatmap(r0["matrix"]))
    check(plots.protocol_runs(r0["protocol"], "bf16 + graph + overlap on"))
    check(plots.bucket_steps(protocol.bucket_rows(protocol.Protocol.model_validate(r0["protocol"]))))
    check(plots.race_window(r0["window_steps"]))
    check(plots.design_rates([r2["off"], *r2["designs"]], r2["explanation"]["findings"]))
    check(plots.step_times(r4["times"]))


def test_saved_figures_fit_the_page(ci_suite):
    """Each PNG the notebooks saved is at the DPI the checks above assume: a reader at 1000 px
    sees the sizes they checked."""
    from PIL import Image

    for png in sorted(Path(ci_suite).glob("0*.png")):
        with Image.open(png) as im:
            assert im.info.get("dpi", (plots.DPI,))[0] == pytest.approx(plots.DPI, abs=1), png.name
