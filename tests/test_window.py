"""python -m nblib window: the trunk depth where the race is intermittent, found by a search over
the protocol's rate, checked against a direct scan on the simulator; the written profile; no
window; bad input in one line; the search's logic on made-up rate curves."""

import contextlib
import io

import pytest
import yaml

from nblib.backends import device
from nblib.core.paths import ROOT
from nblib.engine import build
from nblib.engine.runner import Runner
from nblib.run import cli
from nblib.schema import params as P
from nblib.schema import tuned
from nblib.studies import protocol, window

BAND = window.Band()
DEPTHS = (6, 12)


def small_profile(path, **changes):
    """sim.yaml's pool geometry (the logits and the MLP's transients come from the large pool, so the
    trunk's depth decides the race) on a shorter workload: 40 sessions x 2 rounds of 3-6 tokens,
    logits sized for 32K entries, bucket 40 the one whose MLP reuses the freed logits; the suite's
    protocol runs twice."""
    prof = yaml.safe_load((ROOT / "params" / "sim.yaml").read_text())
    prof["model"]["max_ctx"] = 32768
    prof["buckets"] = [1, 8, 40]
    prof["workload"].update(rounds=2, turn_ctx=2048, out_min=3, out_max=6, think_min=1, think_max=3)
    prof["protocol_runs"] = 2
    prof.update(changes)
    path.write_text(yaml.safe_dump(prof, sort_keys=False))
    return path


def window_cli(*args):
    """cli.main(["window", *args]): (exit code, what it printed)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        try:
            cli.main(["window", *map(str, args)])
            code = 0
        except SystemExit as e:
            code = e.code
    return code, buf.getvalue()


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return small_profile(tmp_path_factory.mktemp("window") / "small.yaml")


@pytest.fixture(scope="module")
def searched(small):
    out = small.parent / "local-sim.yaml"
    depths = f"{DEPTHS[0]}:{DEPTHS[1]}"
    code, printed = window_cli("--params", small, "--depths", depths, "--runs", 1, "--out", out)
    assert code == 0, printed
    return out, printed


def direct_rate(prof, depth):
    """The rate at one depth by the suite's own protocol (its seeds and runs), the depth built and
    captured as notebook 00 does: measured directly, without the search's code."""
    dev = device.get("sim")
    m = build.model(dev, {**prof["model"], "trunk_layers": depth}, index_dtype="bf16", overlap="on")
    runner = Runner(m, prof["buckets"]).capture()
    seeds = protocol.seeds(prof["seed"], prof["protocol_runs"])
    return protocol.run(runner, prof["workload"], seeds, progress=None).pooled


@pytest.fixture(scope="module")
def scan(small, searched):
    """The direct rate at the depth the search chose and at the range's two ends: the window lies
    between ends on either side of the band, and the chosen depth inside it. (Each depth costs a
    capture and the protocol's runs: the ends and the choice say what the test asserts.)"""
    prof = P.load(small)
    chosen = P.load(searched[0])["model"]["trunk_layers"]
    return {d: direct_rate(prof, d) for d in sorted({DEPTHS[0], chosen, DEPTHS[1]})}


def test_the_search_lands_inside_the_window_a_direct_scan_finds(searched, scan):
    out, printed = searched
    chosen = P.load(out)["model"]["trunk_layers"]
    shallow, deep, p = scan[DEPTHS[0]], scan[DEPTHS[1]], scan[chosen]
    counts = {d: (q.corrupted_sessions, q.sessions) for d, q in scan.items()}
    assert shallow.rate > BAND.hi and deep.rate < BAND.lo, counts  # a window lies between the ends
    assert BAND.lo <= p.rate <= BAND.hi and DEPTHS[0] < chosen < DEPTHS[1], counts
    # the search's confirm is the suite's protocol: the same count the direct run measured there
    line = f"depth {chosen:3d}: {window.sessions(p.corrupted_sessions, p.sessions)}, inside (confirm"
    assert line in printed
    probed = {int(line.split()[1].rstrip(":")) for line in printed.splitlines() if line.startswith("depth")}
    assert len(probed) < DEPTHS[1] - DEPTHS[0] + 1, printed  # a search, not a scan
    assert "the rate falls as the trunk deepens" in printed


def test_the_written_profile_is_the_input_with_the_chosen_depth(searched, small):
    out, printed = searched
    got, want = P.load(out), P.load(small)
    want["model"]["trunk_layers"] = got["model"]["trunk_layers"]
    assert got == want
    header = [line[2:].strip() for line in out.read_text().splitlines() if line.startswith("#")]
    points = [line.strip() for line in printed.splitlines() if line.startswith("depth")]
    assert points and all(p in header for p in points)
    assert "`python -m nblib window --params small.yaml --runs 1 --depths 6:12` at commit" in " ".join(header)
    assert not list(out.parent.glob(".*.tmp")), "the atomic write left its temporary file"
    # beside it, the search's record: what the header says, as data
    (record,) = tuned.read_records(out.parent)
    assert tuned.record_path(out).exists() and record.depth == got["model"]["trunk_layers"]
    assert [p.line() for p in record.points] == points and record.reason in printed
    assert record.command == "python -m nblib window --params small.yaml --runs 1 --depths 6:12"


def test_no_window_says_why_with_the_points_and_writes_nothing(tmp_path):
    """With bucket 8 the largest, the logits (8 rows of 128 KB) come from the small pool, where the
    trunk's own first transient reuses them: the race is lost at every depth, so the depth is no
    knob for it (ci.yaml's small logits behave alike)."""
    prof = small_profile(tmp_path / "no-race.yaml", buckets=[1, 8])
    out = tmp_path / "local.yaml"
    code, printed = window_cli("--params", prof, "--depths", "4:12", "--runs", 1, "--out", out)
    assert code == 1
    assert not out.exists()
    assert "no depth gives an intermittent rate: every depth probed corrupts more than 40%" in printed
    assert [line.split(":")[0] for line in printed.splitlines() if line.startswith("depth")] == [
        "depth   4",
        "depth  12",
        "depth   8",
    ]


BAD = [  # (arguments, or a profile change, and what the one line must say)
    (["--depths", "12:4"], "--depths must be LO:HI, two trunk depths, 0 <= LO < HI (e.g. 8:40), got '12:4'"),
    (["--depths", "deep"], "--depths must be LO:HI"),
    (["--band", "0.4:0.1"], "--band must be LO:HI, two rates with 0 <= LO < HI <= 1"),
    (["--runs", "0"], "--runs must be a whole number of protocol runs, at least 1, got 0"),
    (["--out", "local.txt"], "--out names the profile to write: a .yaml file"),
    ({"logits_policy": "persistent"}, "the profile's logits_policy is 'persistent', a fix"),
    ({"overlaps": ["off"]}, "the window is the race's: the profile must list bf16 in index_dtypes"),
    ({"buckets": [1]}, "the race needs a bucket of at least 2 requests"),
    ({"trunk_layer": 3}, "unknown key 'trunk_layer'"),
]


@pytest.mark.parametrize("bad,message", BAD, ids=[str(b) for b, _ in BAD])
def test_bad_input_fails_in_one_line_before_a_model_is_built(tmp_path, monkeypatch, bad, message):
    monkeypatch.setattr(build, "model", lambda *a, **k: pytest.fail("a model was built"))
    prof = small_profile(tmp_path / "p.yaml", **(bad if isinstance(bad, dict) else {}))
    out = tmp_path / "local.yaml"
    args = ["--params", prof, "--out", out, *(bad if isinstance(bad, list) else [])]
    code, printed = window_cli(*args)
    assert isinstance(code, str) and code.startswith("error: ") and message in code and "\n" not in code, code
    assert printed == "" and not out.exists() and not (tmp_path / "local.txt").exists()


def test_a_missing_profile_fails_in_one_line(tmp_path):
    code, _ = window_cli("--params", tmp_path / "nope.yaml")
    assert code.startswith("error: no params file") and "\n" not in code


# -- the search's logic, on made-up curves (rate by depth) -------------------------------------


def curve(rates, confirm=None, sessions=40):
    """measure(depth, kind) from rate functions (confirm: another one for the confirming run),
    counting what it was asked."""
    asked = []

    def measure(depth, kind):
        asked.append((depth, kind))
        r = (confirm if kind == "confirm" and confirm else rates)(depth)
        k = round(r * sessions)
        run = protocol.ProtocolRun(
            seed=0, sessions=sessions, corrupted_sessions=k, steps=10, corrupted_steps=min(k, 10), rows=0,
            corrupted_rows=0, rows_per_corrupted_step=None, concurrency=sessions, buckets=[],
        )  # fmt: skip
        return window.Point.of(depth, kind, protocol.summarise([run]), BAND)

    return measure, asked


def falling(edge, width=4):
    """All sessions below `edge`, none from edge + width, linear between."""
    return lambda d: min(1.0, max(0.0, (edge + width - d) / width))


def test_a_falling_rate_is_bisected_to_the_band_and_confirmed():
    measure, asked = curve(falling(40))
    points, choice = window.run_search(measure, 15, 62, BAND, near=31)
    assert 0.1 <= falling(40)(choice.depth) <= 0.4 and choice.direction == "falls"
    assert asked[:2] == [(15, "search"), (62, "search")] and asked[-1] == (choice.depth, "confirm")
    assert len(asked) <= 9  # two ends, log2(47) bisections, one confirm


def test_a_rising_rate_is_found_too():
    measure, _ = curve(lambda d: 1 - falling(20)(d))
    _, choice = window.run_search(measure, 0, 40, BAND, near=10)
    assert choice.direction == "rises" and 0.1 <= 1 - falling(20)(choice.depth) <= 0.4


def test_a_jump_between_adjacent_depths_is_confirmed_on_both_sides_then_reported():
    measure, asked = curve(lambda d: 0.9 if d <= 20 else 0.0)
    points, choice = window.run_search(measure, 10, 30, BAND, near=20)
    assert choice.depth is None and "jumps across the band between adjacent depths" in choice.reason
    assert {(20, "confirm"), (21, "confirm")} <= set(asked)
    assert "20: 36/40 above, 21: 0/40 below (both confirmed)" in choice.reason


def test_a_search_inside_the_band_that_the_confirm_refutes_goes_on_bisecting():
    # the search's seeds see 25 % at depth 38 (the confirm: 60 %); the edge lies deeper
    search = lambda d: 0.25 if d == 38 else falling(41)(d)  # noqa: E731
    measure, asked = curve(search, confirm=falling(41))
    _, choice = window.run_search(measure, 15, 62, BAND, near=38)
    assert (38, "confirm") in asked and choice.depth not in (None, 38)
    assert 0.1 <= falling(41)(choice.depth) <= 0.4


def test_every_rate_above_the_band_widens_the_range_deeper_only_when_it_was_not_given():
    measure, asked = curve(falling(100))
    (lo, hi), widen_to = window.default_range(31)
    _, choice = window.run_search(measure, lo, hi, BAND, near=31, widen_to=widen_to)
    assert max(d for d, _ in asked) > hi and choice.depth is not None
    measure, _ = curve(falling(100))
    _, choice = window.run_search(measure, lo, hi, BAND, near=31)
    assert choice.depth is None and "more than 40% of sessions" in choice.reason and "deeper" in choice.reason


def test_every_rate_below_the_band_widens_shallower_down_to_no_trunk():
    measure, asked = curve(lambda d: 0.0)
    _, choice = window.run_search(measure, 15, 62, BAND, near=31, widen_to=124)
    assert [d for d, _ in asked] == [15, 62, 38, 7, 3, 1, 0]
    assert choice.depth is None and "fewer than 10% of sessions" in choice.reason


def test_two_edges_prefer_the_one_where_the_rate_falls():
    # a bump: the rate rises through the band near 8 and falls through it near 44
    bump = lambda d: min(1 - falling(6)(d), falling(42)(d))  # noqa: E731
    measure, _ = curve(bump)
    _, choice = window.run_search(measure, 0, 60, BAND, near=30)
    assert choice.direction == "falls" and 42 <= choice.depth <= 46
