"""python -m nblib window: the command line of the search for the trunk depth where the race is
intermittent (nblib.studies.window). It checks every argument before a model is built, prints
each point as it is measured and the choice, and writes the tuned profile (nblib.schema.tuned)."""

from pathlib import Path

import yaml

from nblib.core.results import commit
from nblib.publish import runindex
from nblib.schema import params, tuned
from nblib.studies import window


class NoWindow(Exception):
    """No depth gives an intermittent rate: the reason is printed, nothing is written."""


def parse_range(text):
    """'LO:HI' as two whole depths, 0 <= LO < HI; a one-line error otherwise."""
    lo, sep, hi = str(text).partition(":")
    try:
        lo, hi = int(lo), int(hi)
    except ValueError:
        lo = hi = -1
    if not sep or not 0 <= lo < hi:
        raise ValueError(f"--depths must be LO:HI, two trunk depths, 0 <= LO < HI (e.g. 8:40), got {text!r}")
    return lo, hi


def parse_band(text):
    """'LO:HI' as two rates, 0 <= LO < HI <= 1 (e.g. 0.1:0.4); a one-line error otherwise."""
    lo, sep, hi = str(text).partition(":")
    try:
        return window.Band(lo=float(lo), hi=float(hi))
    except ValueError:
        raise ValueError(
            f"--band must be LO:HI, two rates with 0 <= LO < HI <= 1 (e.g. 0.1:0.4), got {text!r}"
        ) from None


def make_ask(depths, band, runs, profile):
    """An Ask from the command line's values (depths None: the default range), for a loaded
    profile; each bad value fails in one line, before anything is built."""
    window.check_profile(profile)
    if not isinstance(runs, int) or runs < 1:
        raise ValueError(f"--runs must be a whole number of protocol runs, at least 1, got {runs!r}")
    return window.Ask(
        depths=parse_range(depths) if depths is not None else None,
        band=parse_band(band),
        runs=runs,
        confirm_runs=profile["protocol_runs"],
    )


def command(found: window.Search):
    """The command line that repeats this search (the range when it was given, the band when not
    the default)."""
    words = ["python -m nblib window --params", found.source, "--runs", str(found.runs)]
    if found.widen_to is None:
        words += ["--depths", f"{found.depths[0]}:{found.depths[1]}"]
    if found.band != window.Band():
        words += ["--band", f"{found.band.lo:g}:{found.band.hi:g}"]
    return " ".join(words)


def print_point(point: window.Point):
    print(point.line(), flush=True)  # each point as it is measured, also when the output is a pipe or a log


def tune(params_path=None, out=None, runs=2, depths=None, band="0.1:0.4"):
    """The search for a profile file, printed point by point, and the tuned profile written to `out`
    (default params/local-<gpu>.yaml); returns its path. Raises NoWindow (the reason printed,
    nothing written) when no depth gives an intermittent rate."""
    path = Path(params_path or params.default_profile())
    profile = params.load(path)
    ask = make_ask(depths, band, runs, profile)
    if out and Path(out).suffix not in (".yaml", ".yml"):
        raise ValueError(f"--out names the profile to write: a .yaml file, got {out}")
    dev = params.resolve_backend(profile["backend"])
    out = Path(out or params.ROOT / "params" / f"local-{tuned.device_slug(dev)}.yaml")
    found = window.search(dev, profile, ask, runindex.shown_path(path), progress=print_point)
    print(found.choice.reason)
    if not found.found:
        raise NoWindow(found.choice.reason)
    tuned.write(out, yaml.safe_load(path.read_text()), profile["model"], found, command(found), commit())
    print(f"wrote {out} in {found.seconds:.0f} s; run it: python -m nblib run --params {out}")
    return out
