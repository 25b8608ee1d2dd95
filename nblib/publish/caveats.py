"""What a run's numbers mean on the backend that measured them.

The CPU simulator runs the same allocator, streams, capture and replay as CUDA, so its rates,
hazards and divergences are measurements of the simulated mechanism; its times are not. A time the
simulator reports is its timing model's: simulated microseconds of the kernels a calibrated model
gives the replay and the eager work around it, with no launch costs. Figures, verdicts and
the writeup say which, through these helpers, instead of a sentence written for a GPU."""

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "GPU_TIMER",
    "backend_notes",
    "direction_note",
    "divergence_note",
    "gpu_time",
    "overhead_sentence",
    "timing_label",
]

GPU_TIMER = "cuda events"  # nblib.instruments.overhead.CUDA_EVENTS: timer's method on CUDA


def gpu_time(method: str | None) -> bool:
    """True when a timing method measured a GPU (CUDA events)."""
    return method == GPU_TIMER


def timing_label(method: str | None) -> str:
    """What a timing method's numbers are, in the words a figure's axis or a verdict needs."""
    if gpu_time(method):
        return "GPU time (CUDA events)"
    if not method:
        return ""
    return "simulated: the calibrated timing model's kernel times, not a GPU's"


def overhead_sentence(cost: Sequence[Mapping[str, Any]]) -> str:
    """The notebook 02 verdict's overhead clause, from overhead.replay_times rows (neither first):
    ratios over the plain replay, labelled with what they measured."""
    ratios = ", ".join(f"{r['instrument']} x{r['ratio']:.2f}" for r in cost[1:] if r["ratio"] is not None)
    method = cost[0]["method"] if cost else ""
    if gpu_time(method):
        return f"Overhead vs plain replay (GPU time, CUDA events): {ratios}."
    return (
        f"Overhead vs plain replay, simulated (the simulator's timing model: modelled kernel times, "
        f"no launches, not a GPU's): {ratios}."
    )


def divergence_note(arms: Sequence[Mapping[str, Any]], recommended: str | None = None) -> str:
    """One sentence when a differential design diverged (notebook 02's arms, dicts), saying what a
    divergence is and, when the recommended design is among them, what that means for it; "" else."""
    seen = [a for a in arms if a.get("comparisons") and a.get("diverged")]
    if not seen:
        return ""
    which = ", ".join(f"{a['design']} {a['diverged']}/{a['comparisons']}" for a in seen)
    s = (
        f"Diverged here: {which}. A divergence means the stashed logits differ from the same kernel rerun "
        f"on the stashed inputs: the stash's copy ran after the main stream had written into the freed "
        f"logits block, so the differential lost the race it watches (the campaign's saw zero divergence)."
    )
    if recommended in {a["design"] for a in seen}:
        s += (
            f" {recommended} is recommended on its rate and the planted divergence alone; its own "
            f"comparisons diverged on this backend, so its stash is inside the window here."
        )
    return s


def backend_notes(results: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Where this run's backend changes what its numbers mean: [(notebook, sentence)], each from
    the run's own results (nblib.publish.report.load's mapping of nblib.schema.results models);
    nothing for a clean GPU run."""
    first = next((r for r in results.values() if r), None)
    notes = []
    if first and first.backend == "sim":
        notes.append(
            (
                "all",
                "Measured on the CPU simulator: its caching allocator, streams, events, capture and replay "
                "are the mechanism's, so rates, hazards and divergences are measurements of it; its replay "
                "timing is a calibrated model, so no time here is a GPU's.",
            )
        )
    for name, fn in _NOTES.items():
        r = results.get(name)
        if r:
            notes += [(name, s) for s in fn(r) if s]
    return notes


def direction_note(bucket_steps: Sequence[Any]) -> str:
    """Where off's race sits against the largest bucket its runs filled, and what that means for an
    instrument that slows a step (bucket_steps: off's pooled BucketSteps); "" with no steps."""
    filled = [b for b in bucket_steps if b.steps]
    if not filled or not any(b.corrupted_steps for b in filled):
        return ""
    top = max(filled, key=lambda b: b.bucket)
    counts = f"{top.corrupted_steps} of {top.steps} of off's steps there lost the race"
    if top.corrupted_steps:
        return (
            f"The race reaches bucket {top.bucket}, the largest these runs filled ({counts}): an "
            "instrument's cost brings tool calls back sooner, more sessions decode together, and their "
            "steps stay in the race, so a design that lengthens the side branch raises the rate with "
            "nothing to offset it. Where the race sits below the largest bucket, those steps leave it "
            "and the two effects can offset: a design's direction is the run's, not the design's alone."
        )
    return (
        f"The race sits below bucket {top.bucket}, the largest these runs filled ({counts}): an "
        "instrument's cost that brings sessions together moves steps out of the race, which can offset "
        "the rise a longer side branch gives the steps that stay."
    )


def _reproduce_notes(r):
    """Which buckets corrupt, which alias, and where an alias stayed clean (the window's doing)."""
    alias = sorted({a.bucket for a in r.aliases or [] if a.overlap == "on" and a.bucket > 1})
    reached = {
        m.bucket
        for m in r.matrix or []
        if (m.index_dtype, m.mode, m.overlap) == ("bf16", "graph", "on") and m.sessions
    }
    bad = (r.fingerprint.buckets_corrupting if r.fingerprint else None) or []
    quiet = [b for b in alias if b not in bad and b in reached]
    if not bad and not alias:
        return []
    s = f"Corrupting buckets in this run: {bad or 'none'}; buckets where a freed block was handed across: "
    s += f"{alias}."
    if quiet:
        s += f" At {quiet} the blocks aliased but no step lost the race: the window kept them clean."
    return [s]


def _differential_notes(r):
    notes = [divergence_note([a.model_dump() for a in (r.off, *r.designs)], r.recommended)]
    timed = ((r.params or {}).get("workload") or {}).get("think_ms_max", 0) > 0
    if r.off is not None and timed:  # tool calls in time: a step's cost moves the batch
        notes.append(direction_note(r.off.bucket_steps))
    cost = r.overhead or []
    if cost and not gpu_time(cost[0].method):
        notes.append(
            "The overhead ratios are the simulator's timing model: modelled kernel times, no launches."
        )
    return notes


def _overlap_notes(r):
    if r.csan is None and r.backend != "cuda":
        return ["PyTorch's CUDA sanitizer instruments CUDA only: not run on this backend."]
    return []


def _fix_notes(r):
    unjudged = [c.check for c in r.checks or [] if c.holds is None]
    if not unjudged:
        return []
    return [
        f"{len(unjudged)} speed check(s) not judged: the step times are the simulator's timing model, "
        f"not a GPU's (the overlap's gain or cost there says nothing of a GPU's)."
    ]


_NOTES = {
    "00_reproduce": _reproduce_notes,
    "02_graph_vs_eager": _differential_notes,
    "03_stream_overlap": _overlap_notes,
}
_NOTES["04_persistent_buffer_fix"] = _fix_notes
