"""cProfile of whole notebooks, their code run in this process with a profile's parameters.

    python scripts/profile_notebook.py --params params/gpu.yaml --only 00 03 04 --out DIR

Each notebook's code cells run in order in one namespace, its parameters cell replaced by the
profile's values as the suite passes them (the keys the notebook declares, output_dir set to DIR),
under cProfile. Writes DIR/<notebook>.txt: wall and CPU seconds, each cell's seconds, the phase
table the notebook recorded (its results.json), then the top functions by cumulative and by own
time. What the phases leave to "other" (study code between the timed phases, figures, tables) is
what this shows. Needs IPython (the notebooks display with it); no Jupyter kernel, no papermill.
"""

import argparse
import cProfile
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))  # the checkout the script is run from

from profile_piece import write_profile  # noqa: E402  (scripts/, the script's own folder)

from nblib.core import phases  # noqa: E402
from nblib.schema import params as P  # noqa: E402

NOTEBOOK_DIR = Path("notebooks")


def cells(name, values):
    """The notebook's code cells as source strings, the parameters cell replaced by `values`."""
    nb = json.loads((NOTEBOOK_DIR / f"{name}.ipynb").read_text())
    out = []
    for c in nb["cells"]:
        if c["cell_type"] != "code":
            continue
        if "parameters" in c.get("metadata", {}).get("tags", []):
            out.append("".join(f"{k} = {v!r}\n" for k, v in values.items()))
        else:
            out.append("".join(c["source"]))
    return out


def profile_one(name, profile, out, top):
    from IPython.display import display

    values = {k: v for k, v in profile.items() if k in P.DECLARES[name]}
    values.update(output_dir=str(out), INTERACTIVE=False)
    ns = {"__name__": "__main__", "display": display}
    prof = cProfile.Profile()
    timed = []
    t0, c0 = time.perf_counter(), time.process_time()
    for i, src in enumerate(cells(name, values)):
        t = time.perf_counter()
        prof.enable()
        exec(compile(src, f"<{name} cell {i}>", "exec"), ns)
        prof.disable()
        timed.append((i, time.perf_counter() - t, src.strip().splitlines()[0][:70] if src.strip() else ""))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    res = json.loads((out / f"{name}.results.json").read_text())
    lines = [f"notebook {name}, profile {profile['backend']}: {wall:.1f} s wall, {cpu:.1f} s CPU\n"]
    lines += [f"cell {i:2d} {s:8.2f} s  {head}\n" for i, s, head in timed if s >= 0.05]
    times = [phases.PhaseTime(**p) for p in res.get("phases", [])]
    if times:
        lines.append(phases.table(times, res.get("wall_seconds", wall)) + "\n")
    write_profile(prof, lines, top, out / f"{name}.txt")
    print(f"{name}: {wall:.1f} s wall -> {out / (name + '.txt')}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params/sim.yaml")
    ap.add_argument("--only", nargs="+", default=["00"], help="notebook numbers or names, in order")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--out", required=True, help="folder for <notebook>.txt and the notebooks' results")
    args = ap.parse_args()
    profile = P.load(Path(args.params))
    names = [n for n in sorted(P.DECLARES) if any(n.startswith(o) for o in args.only)]
    if not names:
        sys.exit(f"error: no notebook matches {args.only}: choose among {', '.join(sorted(P.DECLARES))}")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        profile_one(name, profile, out, args.top)


if __name__ == "__main__":
    main()
