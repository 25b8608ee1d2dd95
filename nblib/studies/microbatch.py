"""The persistent-buffer fix under two overlapped micro-batches: a buffer is a fix per stream of use.

Dual-batch overlap runs a batch as two micro-batches at once, each on a stream of its own. Here each
micro-batch is the model's decode step with the persistent logits policy, on its own stream with its
own side stream for the indexer, both forked from the capture stream and joined at its end; the two
share the weights, and each writes a cache of its own (the audit cannot tell which slots a scattered
write touches, so two micro-batches writing one cache would read as a race of their own). The model
keys its persistent buffers by the role of the stream that uses them ("side") and the bucket, so with
one model-wide set of buffers both micro-batches' side streams write the same logits buffer, and read
it for top-k, with nothing ordering the two: the capture audit names a write-after-write. One set of
buffers per micro-batch gives each side stream its own bytes, and the audit finds nothing.

    runs = microbatch.audits(dev, profile["model"], bucket=4)   # {"shared": Audited, ...}
    rows = microbatch.rows(runs); microbatch.verdict(runs)
"""

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from nblib.engine import build
from nblib.engine.model import DecodeModel
from nblib.instruments.audit import target as audit_target

if TYPE_CHECKING:
    from nblib.backends.device import Device

__all__ = [
    "CTX",
    "LAYOUTS",
    "MICRO_BATCHES",
    "Audited",
    "OverlappedStep",
    "audits",
    "rows",
    "step",
    "verdict",
]

LAYOUTS = {
    "shared": "one model-wide set of persistent buffers, keyed by stream role and bucket",
    "per micro-batch": "a set of persistent buffers for each micro-batch",
}
MICRO_BATCHES = 2
CTX = 256  # entries a request: the audit reads what a capture touches, not how long it runs


class OverlappedStep:
    """Both micro-batches' decode steps, each on its own stream, into persistent outputs."""

    def __init__(self, dev: "Device", models: Sequence[DecodeModel], batches_: Sequence[build.Batch]):
        self.dev, self.models, self.batches = dev, models, batches_
        self.streams = [dev.Stream() for _ in models]
        d, width = dev.torch_device, models[0].cfg.d_model
        self.outs = [torch.empty(len(b.tokens), width, dtype=torch.bfloat16, device=d) for b in batches_]

    def __call__(self) -> None:
        cap = self.dev.current_stream()
        for s in self.streams:
            s.wait_stream(cap)
        for m, s, b, out in zip(self.models, self.streams, self.batches, self.outs):
            with self.dev.stream(s):
                y, _ = m.step(*b)
                out.copy_(y)
        for s in self.streams:
            cap.wait_stream(s)


def step(dev: "Device", shapes: Mapping[str, Any], bucket: int, layout: str) -> OverlappedStep:
    """The overlapped step of two micro-batches of `bucket` requests each, with the buffers laid
    out as `layout` says (LAYOUTS), built and run once eagerly (the warm-up a capture needs)."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown buffer layout {layout!r}: choose one of {', '.join(LAYOUTS)}")
    # one weight set a process (build.model), so the micro-batches share the weights
    models = [
        build.model(dev, shapes, index_dtype="bf16", overlap="on", logits_policy="persistent")
        for _ in range(MICRO_BATCHES)
    ]
    if layout == "shared":
        for m in models[1:]:
            m.buffers = models[0].buffers
    for m in models:
        m.bucket = bucket  # type: ignore[assignment]  # DecodeModel declares `bucket = None` untyped
        m.prepare(bucket)
    fn = OverlappedStep(dev, models, [build.full_batch(m, bucket, ctx=CTX) for m in models])
    fn()
    dev.synchronize()
    return fn


class Audited(NamedTuple):
    """One layout's audit and the persistent buffers its micro-batches held ({address: name})."""

    report: audit_target.TargetReport
    buffers: dict[str, str]


def audits(dev: "Device", shapes: Mapping[str, Any], bucket: int) -> dict[str, Audited]:
    """The capture audit of the overlapped step in each layout: {layout: Audited}."""
    out = {}
    for layout in LAYOUTS:
        fn = step(dev, shapes, bucket, layout)
        rep = audit_target.audit_step(fn, dev, target=f"two micro-batches of {bucket}, buffers {layout}")
        names = {
            b["addr"]: f"micro-batch {i}'s persistent buffer {b['buffer']}"
            if layout != "shared"
            else f"the shared persistent buffer {b['buffer']}"
            for i, m in enumerate(fn.models)
            for b in m.buffers.describe()
        }
        out[layout] = Audited(rep, names)
    return out


def _named(run, hazard):
    """The bytes a hazard names: the persistent buffer at its address, else the audit's tensor name."""
    return run.buffers.get(hazard.addr, hazard.first.tensor.name)


def rows(runs: Mapping[str, Audited]) -> list[dict[str, Any]]:
    """One row per layout: the audit's status, its hazards' kinds, the bytes and the streams."""
    out = []
    for layout, run in runs.items():
        hs = run.report.hazards
        out.append(
            dict(
                layout=layout,
                status=run.report.status,
                hazards=len(hs),
                kinds=", ".join(sorted({h.kind for h in hs})) or "none",
                bytes_of=", ".join(sorted({_named(run, h) for h in hs})) or "none",
                streams=", ".join(sorted({f"{h.first.stream} / {h.second.stream}" for h in hs})) or "none",
            )
        )
    return out


def verdict(runs: Mapping[str, Audited]) -> str:
    """One sentence: whether the shared buffer races between the micro-batches, and the fix."""
    shared, own = runs["shared"], runs["per micro-batch"]
    waw = [h for h in shared.report.hazards if h.kind == "write-after-write"]
    if own.report.status == "clean" and waw:
        h = waw[0]
        return (
            f"With one model-wide set of persistent buffers, the two micro-batches' side streams "
            f"({h.first.stream} and {h.second.stream}) both write {_named(shared, h)} with nothing ordering "
            f"them: the audit names {len(shared.report.hazards)} hazard(s), {len(waw)} a write-after-write. "
            f"With a set per micro-batch it finds none: a persistent buffer is a fix per stream of use."
        )
    return (
        f"The audit does not show the shared buffer's race: shared {shared.report.status} "
        f"({len(shared.report.hazards)} hazard(s), {len(waw)} write-after-write), per micro-batch "
        f"{own.report.status} ({len(own.report.hazards)} hazard(s))."
    )
