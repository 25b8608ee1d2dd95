"""The same lesson in kind on both backends: notebook 02's committed results, design by design.

outputs/gpu-timed/ holds notebook 02 on the H200 and outputs/sim-timed/ on the simulator, each on its
profile with tool calls that last a duration. For every design both ran, the simulator should diverge
only where the GPU diverges, and move the rate the same way (raises, unchanged, lowers: Fisher's test
against the arm without instrument, as notebook 02 reads it).

Where they do not agree yet, the case is a strict expected failure with what was measured: on the
simulator every copying design raises the rate, while on the H200 the same designs leave it unchanged;
campaign and prealloc diverge in 11 of 136 comparisons on the simulator and in none on the H200. The
simulator's rise comes from the side-stream clones' time before the top-k, launch latency included: made
free in its timing model, they leave the rate within chance of off's (outputs/probe/sim-copy-cost/).
The divergence comes from the top-k's time: the committed simulator runs time torch.topk as one pass
over its bytes (about 7 us), shorter than the clone before it, so a late write often lands in the
clone; a GPU runs several kernels for one call (about 96 us on the H200), and with that time the clones
stop diverging (outputs/probe/sim-topk-cost/). docs/story.md gives the likely reason the H200's rate
does not move, and what it rests on: the direction follows where the race sits. With the same profile
an H100's race reaches the largest bucket and the copying designs raise the rate there, as on the
simulator; the H200's never does (test below). Given the H200's side branch's fall with the batch and
tool calls scaled to its step, the simulator's race leaves its largest bucket and main_stash reads
unchanged, none diverging (outputs/probe/sim-row-topk/, a counterfactual). Timed by the calibration
measured on that H100 (outputs/probe/sim-h100-cal/), the simulator reads every design as the H100 does,
none diverging (last test): what the H200 comparison waits for is the same file measured on an H200.

The forced order is compared too, with the GPU run that has it (outputs/gpu-h100/, an H100): under it
each design corrupts, or stays equal to eager, alike on both backends, in the same share of its
replays.
"""

import json

import pytest

from nblib.core.paths import ROOT

GPU = ROOT / "outputs" / "gpu-timed" / "02_graph_vs_eager.results.json"
SIM = ROOT / "outputs" / "sim-timed" / "02_graph_vs_eager.results.json"


def _designs(path):
    r = json.loads(path.read_text())
    effects = {f["design"]: f["effect"] for f in r["explanation"]["findings"]}
    return r, {a["design"]: dict(a, effect=effects[a["design"]]) for a in r["designs"]}


def _unmet(reason):
    return pytest.mark.xfail(strict=True, reason=reason)


DIRECTION = [
    "canary",
    pytest.param("campaign", marks=_unmet("sim raises 110/200 vs 51; H200 unchanged (51/200 vs 44)")),
    pytest.param("prealloc", marks=_unmet("sim raises 110/200 vs 51; H200 unchanged (53/200 vs 44)")),
    pytest.param("main_stash", marks=_unmet("sim raises 110/200 vs 51; H200 unchanged (40/200 vs 44)")),
    "refs",
]
DESIGNS = ["canary", "campaign", "prealloc", "main_stash", "refs"]
_COPY_LOSES = "sim 11/136 diverged (its top-k one pass of bytes, shorter than the clone); H200 0/469"
DIVERGENCE = [
    "canary",
    pytest.param("campaign", marks=_unmet(_COPY_LOSES)),
    pytest.param("prealloc", marks=_unmet(_COPY_LOSES)),
    "main_stash",
    "refs",
]


def test_both_backends_ran_the_same_designs_on_the_timed_workload():
    (g, gd), (s, sd) = _designs(GPU), _designs(SIM)
    assert g["backend"] == "cuda" and s["backend"] == "sim"
    assert g["status"] == s["status"] == "ok"
    assert set(gd) == set(sd) == set(DESIGNS)
    for r in (g, s):
        assert r["params"]["workload"]["think_ms_max"] > 0, "02 ran with tool calls counted in steps"


@pytest.mark.parametrize("design", DIVERGENCE)
def test_a_design_diverges_on_the_simulator_only_where_it_diverges_on_the_gpu(design):
    gpu, sim = _designs(GPU)[1][design], _designs(SIM)[1][design]
    assert sim["comparisons"] > 0 or design == "canary"
    assert (sim["diverged"] > 0) == (gpu["diverged"] > 0), (sim["diverged"], gpu["diverged"])


@pytest.mark.parametrize("design", DIRECTION)
def test_a_design_moves_the_rate_alike_on_both_backends(design):
    gpu, sim = _designs(GPU)[1][design], _designs(SIM)[1][design]
    assert sim["effect"] == gpu["effect"], (sim["effect"], gpu["effect"])


GPU_H100 = ROOT / "outputs" / "gpu-h100" / "02_graph_vs_eager.results.json"


def _race_reaches_the_largest_bucket(bucket_steps):
    """Whether any step in the largest bucket the runs filled lost the race; bucket_steps: off's."""
    largest = max((b for b in bucket_steps if b["steps"]), key=lambda b: b["bucket"])
    return largest["corrupted_steps"] > 0


def test_the_copying_designs_raise_the_rate_only_where_the_race_reaches_the_largest_bucket():
    """A design's direction is not the design's alone. Its cost brings tool calls back sooner, so more
    sessions decode together: where the race reaches the largest bucket (the H100, the simulator), its
    steps stay in the race and the clones' in-step rise shows; where the race sits below it (the H200),
    steps leave it and the two offset. The same profile on two GPUs, and the simulator."""
    readings = {}
    for path in (GPU, GPU_H100, SIM):
        r, designs = _designs(path)
        assert r["status"] == "ok"
        copying = {designs[d]["effect"] for d in ("campaign", "prealloc", "main_stash")}
        readings[r["device"]] = (_race_reaches_the_largest_bucket(r["off"]["bucket_steps"]), copying)
    for device, (reach, effects) in readings.items():
        assert effects == ({"raises"} if reach else {"unchanged"}), (device, reach, effects)
    assert sorted(reach for reach, _ in readings.values()) == [False, True, True], readings


def test_under_the_forced_order_each_design_reads_alike_on_both_backends():
    def forced(path):
        r = json.loads(path.read_text())
        assert r["status"] == "ok"
        return {f["design"]: f["differing"] / f["replays"] for f in r["forced"]}

    gpu, sim = forced(GPU_H100), forced(SIM)
    assert set(gpu) == set(sim) == {"off", "canary", "campaign", "prealloc", "main_stash", "refs"}
    for design in gpu:
        assert (gpu[design] > 0) == (sim[design] > 0), (design, gpu[design], sim[design])
        assert abs(gpu[design] - sim[design]) <= 0.25, (design, gpu[design], sim[design])
    assert gpu["refs"] == sim["refs"] == 0  # the race gone from its graphs, on both


def test_the_writeup_says_where_the_race_sits_against_the_largest_bucket():
    from nblib.publish import report
    from nblib.publish.caveats import direction_note
    from nblib.studies.protocol import BucketSteps

    def steps(*rows):
        return [BucketSteps(bucket=b, steps=n, corrupted_steps=c) for b, n, c in rows]

    below = direction_note(steps((20, 30, 12), (40, 300, 0), (48, 0, 0)))  # 48 captured, never filled
    assert below.startswith("The race sits below bucket 40") and "0 of 300" in below
    reaches = direction_note(steps((36, 34, 19), (40, 17, 1)))
    assert reaches.startswith("The race reaches bucket 40") and "1 of 17" in reaches
    assert direction_note(steps((20, 30, 0), (40, 300, 0))) == ""  # no race to place
    for path, word in (
        (GPU, "sits below bucket 40"),
        (GPU_H100, "reaches bucket 40"),
        (SIM, "reaches bucket 40"),
    ):
        assert word in "\n".join(report.backend_section(report.load(path.parent))), path


SIM_H100 = ROOT / "outputs" / "probe" / "sim-h100-cal" / "protocol.json"


def _reading(off, arm):
    """raises, unchanged or lowers: Fisher's exact test of the arm's corrupted sessions against off's."""
    from scipy.stats import fisher_exact

    table = [
        [arm["corrupted_sessions"], arm["sessions"] - arm["corrupted_sessions"]],
        [off["corrupted_sessions"], off["sessions"] - off["corrupted_sessions"]],
    ]
    if fisher_exact(table).pvalue >= 0.05:
        return "unchanged"
    return (
        "raises"
        if arm["corrupted_sessions"] / arm["sessions"] > off["corrupted_sessions"] / off["sessions"]
        else "lowers"
    )


def test_the_simulator_on_an_h100s_calibration_reads_every_design_as_that_h100():
    """The simulator follows the GPU it is calibrated on: timed by the file scripts/calibrate_sim.py
    measured on the H100, every design moves the rate the H100's way and diverges only where it does."""
    probe = json.loads(SIM_H100.read_text())
    assert probe["device"] == "CPU simulator" and probe["calibration"] == "params/calibration/h100.json"
    assert json.loads((ROOT / probe["calibration"]).read_text())["device"].startswith("NVIDIA H100")
    sim = {a["design"]: a for a in probe["designs"][0]["comparison"]["arms"]}
    gpu_run = json.loads(GPU_H100.read_text())
    gpu = {a["design"]: a for a in (gpu_run["off"], *gpu_run["designs"])}
    assert gpu_run["device"].startswith("NVIDIA H100") and set(sim) == set(gpu)
    for design in DESIGNS:
        assert _reading(sim["off"], sim[design]) == _reading(gpu["off"], gpu[design]), design
        assert (sim[design]["diverged"] > 0) == (gpu[design]["diverged"] > 0), design
    assert _race_reaches_the_largest_bucket(probe["variants"][0]["bucket_steps"])
