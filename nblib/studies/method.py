"""Notebook 07: the campaign's method on code written elsewhere, end to end, through the same public
API a user calls on their own engine (docs/your-engine.md): transformers' Qwen2-MoE and DeepSeek-V3
decode steps with the shared expert on a side stream (examples/audit/hf_moe.py), buggy and fixed.

For each form: the audit names the hazards from one capture; `--confirm` replays each with its losing
order forced and counts the replays that differ from eager (and the natural replays, no delay); the
probe differential (nblib.instruments.probes, a probe at the shared expert's input in every layer)
counts the natural replays that differ with the instrument in the graph. The fixed form must have no
hazard and stay equal to eager under every forced order."""

import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from pydantic import BaseModel

from nblib.instruments.audit import target as audit_target
from nblib.instruments.probes import Differential
from nblib.studies.engines import in_repository

if TYPE_CHECKING:
    from nblib.backends.device import Device

__all__ = ["FORMS", "MODELS", "MethodRow", "run_all", "run_one", "spec", "verdict"]

MODELS = ("qwen2_moe", "deepseek_v3")
FORMS = ("buggy", "record_stream")  # the race, and the fix: the allocator holds the block for the side
EXAMPLE = "examples/audit/hf_moe.py"


def spec(model: str, form: str) -> str:
    """The TARGET of one form, as a user types it."""
    return f"{EXAMPLE}:{model}" + ("" if form == "buggy" else f"_{form}")


class MethodRow(BaseModel):
    """One form on one backend, every step of the method."""

    model: str
    form: str
    backend: str
    target: str
    hazards: int
    confirmed: int  # hazards whose forced replays differed from eager
    forced: str  # differing/replays over the distinct forced schedules (hazards', or branches' when clean)
    natural: str  # natural replays differing from eager, no instrument
    design: str  # the probe differential's design
    probed: str  # natural replays differing with the probes in the graph (output or any probe)
    probe_differing: int  # replays where a probe differed
    seconds: float


def run_one(dev: "Device", model: str, form: str, replays: int, design: str = "main_stash") -> MethodRow:
    """Audit with --confirm, then the probe differential on a fresh build of the same form."""
    t0 = time.perf_counter()
    target = spec(model, form)
    rep = audit_target.audit(in_repository(target), device=dev, label=target, confirm=replays)
    if rep.status == "failed":
        raise RuntimeError(f"{target} on {dev.name}: {rep.failure.message}")
    c = rep.confirm
    schedules = list({k.delayed: k for k in c.hazards}.values()) or c.branches
    diff = Differential(dev, design).run(audit_target.load(in_repository(target)).fn(dev), replays=replays)
    either = max(diff.output.differing, max((p.differing for p in diff.probes), default=0))
    return MethodRow(
        model=model,
        form=form,
        backend=dev.name,
        target=target,
        hazards=len(rep.hazards),
        confirmed=sum(h.confirmed for h in rep.hazards),
        forced=f"{sum(k.differing for k in schedules)}/{sum(k.replays for k in schedules)}",
        natural=f"{c.natural.differing}/{c.natural.replays}",
        design=design,
        probed=f"{either}/{replays}",
        probe_differing=max((p.differing for p in diff.probes), default=0),
        seconds=round(time.perf_counter() - t0, 2),
    )


def run_all(
    devs: Iterable["Device"],
    replays: int,
    design: str = "main_stash",
    progress: Callable[[str], object] | None = print,
) -> list[MethodRow]:
    rows = []
    for dev in devs:
        for model in MODELS:
            for form in FORMS:
                rows.append(run_one(dev, model, form, replays, design))
                if progress:
                    r = rows[-1]
                    progress(f"{r.target} on {r.backend}: {r.hazards} hazard(s), forced {r.forced}")
    return rows


def _n(frac):
    return int(frac.split("/")[0])


def verdict(rows: Sequence[MethodRow]) -> str:
    """One paragraph from the rows, per backend: the race named, proved under the forced order, what
    the replays showed without and with the probes, and the fix's proof."""
    return " ".join(
        _backend_verdict(b, [r for r in rows if r.backend == b])
        for b in dict.fromkeys(r.backend for r in rows)
    )


def _backend_verdict(backend, rows):
    bug = [r for r in rows if r.form == "buggy"]
    fix = [r for r in rows if r.form != "buggy"]
    unnamed = [r.model for r in bug if not r.hazards]
    if unnamed:
        s = f"On {backend}: the audit names no hazard in {', '.join(unnamed)}"
    else:
        s = f"On {backend}: the audit names " + ", ".join(f"{r.hazards} hazard(s) in {r.model}" for r in bug)
    if all(r.confirmed == r.hazards for r in bug):
        s += (
            "; forced, every one changes the output (" + ", ".join(f"{r.model} {r.forced}" for r in bug) + ")"
        )
    else:
        s += (
            "; forced, not every hazard changes the output ("
            + ", ".join(f"{r.model} {r.confirmed} of {r.hazards}" for r in bug)
            + ")"
        )
    s += ". Left alone, the replays differ " + ", ".join(f"{r.natural} ({r.model})" for r in bug)
    s += ", and with the probes in the graph " + ", ".join(r.probed for r in bug)
    held = all(r.hazards == 0 and not any(_n(x) for x in (r.forced, r.natural, r.probed)) for r in fix)
    forms = ", ".join(sorted({r.form for r in fix}))
    if held:
        s += (
            f". The fix ({forms}): no hazard, and equal to eager under every forced order and in every replay"
        )
    else:
        s += ". The fix does not hold: " + ", ".join(
            f"{r.model}: {r.hazards} hazard(s), forced {r.forced}, natural {r.natural}" for r in fix
        )
    return s + "."
