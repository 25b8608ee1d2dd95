"""The capture audit against the field: every examples/field case, buggy and fixed, on one backend.

Usage: python scripts/field_table.py OUTDIR [--backend sim|cuda]
Writes OUTDIR/field.json (each form's verdict beside its expectation, each case's instrument reading)
and OUTDIR/table.md, each atomically (a temporary file in OUTDIR, then a rename). The commit recorded is
$NBLIB_COMMIT when set, else `git rev-parse HEAD`. Exit 0 when every verdict and every instrument
reading is what examples/field/cases.py expects, 1 otherwise. Each form is built and audited on a fresh
device facade, in this process; about 10 s on the simulator.
"""

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIELD = ROOT / "examples" / "field"


def load_file(path, name):
    """A module loaded by path, with its folder on sys.path while it imports (the field files import
    _field, their neighbour)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # pydantic and dataclasses look their module up by name
    sys.path.insert(0, str(Path(path).parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(Path(path).parent))
    return module


def load_cases():
    """examples/field/cases.py, loaded: CASES (each bug, its forms, what the audit should say) and
    check_holds."""
    return load_file(FIELD / "cases.py", "_field_cases")


def function(spec):
    """`path.py:name` (relative to the repository) as a function."""
    path, name = spec.split(":")
    module = load_file(ROOT / path, "_field_check_" + Path(path).stem)
    return getattr(module, name)


def commit():
    if os.environ.get("NBLIB_COMMIT"):
        return os.environ["NBLIB_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out.stdout.strip()


def base(name):
    """`qkv_a (dsv4_attention.py:134)` -> `qkv_a`."""
    return name.split(" (")[0]


def verdict(rep):
    """The audit's verdict on one form, as the json records it."""
    pairs = sorted(
        {
            (h.kind, base(h.first.tensor.name), h.first.stream, base(h.second.tensor.name), h.second.stream)
            for h in rep.hazards
        }
    )
    return dict(
        status=rep.status,
        exit_code=rep.exit_code,
        ops=rep.ops,
        hazards=[
            dict(kind=k, first_tensor=ft, first_stream=fs, second_tensor=st, second_stream=ss)
            for k, ft, fs, st, ss in pairs
        ],
        failure=rep.failure.message if rep.failure else None,
    )


def agrees(expect, got):
    if got["status"] != expect.status:
        return False
    if expect.status != "hazards":
        return True
    return any(h["kind"] == expect.kind and h["first_tensor"] == expect.tensor for h in got["hazards"])


def says(got):
    """One table cell: the exit code and what the audit named."""
    if got["status"] == "hazards":
        named = sorted({f"{h['kind']} on `{h['first_tensor']}`" for h in got["hazards"]})
        return f"exit 1: {'; '.join(named)}"
    if got["status"] == "clean":
        return "exit 0: none"
    return "exit 2: capture failed"


def run(backend):
    from nblib.backends import device as devices
    from nblib.instruments.audit import target as audit_target

    cases_module = load_cases()
    rows, ok = [], True
    device_name = devices.get(backend).device_name()
    for case in cases_module.CASES:
        forms = []
        for form in case.forms:
            t0 = time.perf_counter()
            rep = audit_target.audit(form.target, device=devices.get(backend))
            got = verdict(rep)
            good = agrees(form.expect, got)
            ok &= good
            forms.append(
                dict(
                    role=form.role,
                    target=form.target,
                    ref=form.ref,
                    commit=form.commit,
                    expect=form.expect.model_dump(exclude_none=True),
                    got=got,
                    agrees=good,
                    seconds=round(time.perf_counter() - t0, 3),
                )
            )
        reading = None
        if case.check is not None:
            fn = function(case.check.function)
            values = {f.role: fn(devices.get(backend), f.target) for f in case.forms}
            holds = cases_module.check_holds(case.check, values)
            ok &= holds
            reading = dict(**case.check.model_dump(), values=values, holds=holds)
        rows.append(
            dict(
                id=case.id,
                bug=case.bug,
                repository=case.repository,
                reference=case.reference,
                engine_files=case.engine_files,
                sees_it=case.sees_it,
                forms=forms,
                check=reading,
            )
        )
    return dict(backend=backend, device=device_name, commit=commit(), cases=rows, ok=ok)


def table(result):
    b = result["backend"]
    lines = [
        f"# The capture audit against the field ({b})",
        "",
        f"Backend `{b}` ({result['device']}), commit `{result['commit']}`. "
        "Produced by `python scripts/field_table.py OUTDIR --backend " + b + "`; the cases, their "
        "sources and expectations are in `examples/field/cases.py`.",
        "",
        f"| bug | engine | reference | buggy form: commit, audit ({b}) | fixed form: commit, audit ({b}) "
        "| where the audit cannot see it | as expected |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in result["cases"]:
        cell = {}
        for role in ("buggy", "fixed"):
            cell[role] = "<br>".join(
                f"`{f['target'].split(':')[1]}` {f['ref']}, {f['commit']}: {says(f['got'])}"
                for f in c["forms"]
                if f["role"] == role
            )
        seen = c["sees_it"]
        if c["check"]:
            v = c["check"]["values"]
            seen += f" ({c['check']['unit']}: buggy {v['buggy']}, fixed {v['fixed']})"
        good = all(f["agrees"] for f in c["forms"]) and (c["check"] is None or c["check"]["holds"])
        lines.append(
            f"| {c['bug']} | {c['repository']} | {c['reference']} | {cell['buggy']} | {cell['fixed']} "
            f"| {seen} | {'yes' if good else '**no**'} |"
        )
    lines += [
        "",
        "Every verdict as cases.py expects it." if result["ok"] else "**Some verdicts differ.**",
        "",
    ]
    return "\n".join(lines)


def write_atomically(path, text):
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; the result is for anyone to read
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--backend", choices=("sim", "cuda"), default="sim")
    args = ap.parse_args(argv)
    outdir = args.outdir.resolve()
    os.chdir(ROOT)  # the targets are named relative to the repository
    sys.path.insert(0, str(ROOT))
    result = run(args.backend)
    outdir.mkdir(parents=True, exist_ok=True)
    write_atomically(outdir / "field.json", json.dumps(result, indent=1) + "\n")
    write_atomically(outdir / "table.md", table(result))
    print(table(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
