"""The capture audit: name every cross-stream race in a capture, from the capture alone.

    report = audit.audit_capture(fn, *args, device=dev)     # captures fn(*args) and audits it
    with audit.recording(dev) as rec:                         # or around code that captures
        runner.capture(record=rec)                            # (rec(bucket) labels captures)
    report = rec.report(names=model.captures)
    report.ok, report.hazards, print(report), report.rows()

How: the trace package records, in program order, each allocation and free, each op's byte accesses
(read or write) and stream, and each event record and wait. Happens-before is computed with a
vector clock per stream (an op ticks its stream's clock; a record snapshots the stream's clock into
the event; a wait merges the event's clock into the stream's). Two accesses race when their bytes
overlap, at least one writes, they run on different streams, and neither op happens before the
other. Accesses are compared by bytes, not by tensor, and the history is kept across frees: a
side-stream kernel still reading a block that the main stream's next tensor reuses is reported with
both tensors' allocation and free sites (PyTorch's CUDA sanitizer forgets a tensor at its free, so it
cannot see that). The audit only reads what the capture recorded; the graph it audits replays the
same with or without it.
"""

import os
import time
import traceback
import warnings
from dataclasses import dataclass, field

from nblib.backends.capture_rules import CUDA_TEXTS, RULES, SimCaptureError
from nblib.instruments.audit.hazards import races
from nblib.instruments.audit.trace import recording as record_captures
from nblib.instruments.audit.trace.stacks import site, skip


class AuditCaptureError(RuntimeError):
    """The function being audited raised while capturing; the message names the op or line."""


@dataclass(eq=False)
class Report:
    traces: list
    hazards: list
    seconds: float
    incomplete: int = 0
    result: object = None  # audit_capture: what fn returned (the capture's static outputs)
    graph: object = None  # audit_capture: the captured graph
    notes: list = field(default_factory=list)
    graph_rows: list = field(default_factory=list)  # the cross-check with the built graphs, if made

    @property
    def ok(self):
        return not self.hazards

    @property
    def ops(self):
        return sum(len(t.ops) for t in self.traces)

    def rows(self, level="ops"):
        """Table rows. level "ops": one per (capture label, tensor pair, op pair); level "tensors":
        one per (capture label, tensor pair), the racing ops listed in first_op / second_op."""
        out = {}
        for h in self.hazards:
            r = h.row()
            key = tuple(sorted((k, str(v)) for k, v in h.label.items() if k != "capture")) + (
                r["first_tensor"],
                r["second_tensor"],
            )
            if level == "ops":
                key += (r["first_op"], r["first_site"], r["second_op"], r["second_site"])
            if key in out:
                o = out[key]
                o["pairs"] += r["pairs"]
                o["nbytes"] = max(o["nbytes"], r["nbytes"])
                for k in ("kind", "first_op", "second_op"):
                    if r[k] not in o[k].split(", "):
                        o[k] += ", " + r[k]
            else:
                out[key] = r
        return list(out.values())

    def by(self, key):
        """Hazards grouped by a label key, e.g. report.by("bucket") -> {8: [...], 4: [...]}."""
        out = {t.label.get(key): [] for t in self.traces}
        for h in self.hazards:
            out.setdefault(h.label.get(key), []).append(h)
        return out

    def summary(self):
        n = len(self.traces)
        head = (
            f"capture audit: {n} capture{'s' * (n != 1)}, {self.ops} ops, "
            f"{len(self.hazards)} hazard{'s' * (len(self.hazards) != 1)} ({self.seconds * 1e3:.1f} ms)"
        )
        if self.incomplete:
            head += f"; {self.incomplete} capture(s) raised and were not audited"
        return head

    def __str__(self):
        if self.ok:
            return self.summary() + ": no cross-stream race"
        seen, parts = set(), [self.summary()]
        for h in self.hazards:  # one block per notebook row, the first instance
            r = h.row()
            key = (
                tuple(sorted(h.label.items())),
                r["first_tensor"],
                r["second_tensor"],
                r["first_op"],
                r["second_op"],
            )
            if key in seen:
                continue
            seen.add(key)
            parts.append(h.describe())
        return "\n".join(parts)

    __repr__ = summary


def name_allocations(traces, names):
    """Give allocations the names a caller noted while capturing: dicts with addr and tensor, and
    optionally bucket (matched against the capture's label) -- e.g. DecodeModel.captures."""
    for tr in traces:
        for a in tr.allocs:
            for n in names:
                if (
                    n.get("addr") == a.addr
                    and n.get("nbytes", a.nbytes) == a.nbytes
                    and ("bucket" not in n or n["bucket"] == tr.label.get("bucket"))
                ):
                    a.name = n["tensor"]


def recording(dev):
    """`with recording(dev) as rec:` records every capture made inside; rec.report() audits them."""
    return record_captures(dev, analyse=audit)


def audit(traces, names=None):
    """Audit recorded captures (a list of trace.CaptureTrace); incomplete ones are skipped."""
    t0 = time.perf_counter()
    done = [t for t in traces if t.complete]
    if names:
        name_allocations(done, names)
    hazards = [h for t in done for h in races(t)]
    notes = [
        f"{t.title()}: {op.name} on stream {op.stream} at {site(op.stack)} is a raw Triton launch that "
        "declares no tensors, so its accesses were not audited (wrap it in a torch.library custom op "
        "with mutates_args, or give the kernel a launch_metadata that returns its tensors)"
        for t in done
        for op in t.ops
        if op.opaque
    ]
    rep = Report(done, hazards, time.perf_counter() - t0, incomplete=len(traces) - len(done))
    rep.notes.extend(notes)
    return rep


def audit_capture(
    fn, *args, device, pool=None, names=None, label=None, keep_graph=False, before_op=None, **kwargs
):
    """Capture fn(*args, **kwargs) on `device` into a new graph and audit it. The report carries
    the graph (report.graph) and what fn returned (report.result); keep_graph=True keeps CUDA's
    graph readable for nblib.instruments.audit.graph_check's cross-check. If fn raises, nothing is left
    capturing, the current stream is restored, and AuditCaptureError names the user's line, the op,
    and the capture rule it broke (if it broke one). before_op (CUDA): called with each op's index
    just before the op is queued (the forced schedule of nblib.instruments.audit.confirm)."""
    dev = device
    if before_op is not None and dev.name != "cuda":
        raise ValueError("before_op needs the CUDA recorder: the simulator delays a replay's nodes instead")
    g = dev.CUDAGraph(keep_graph=keep_graph)
    prev = dev.current_stream()
    rec = recording(dev)
    rec.before_op = before_op
    # warnings raised inside the capture (torch's CUDA warnings from destructors) help name the rule
    with rec, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with rec(**(label or {})), dev.graph(g, pool=pool):
                result = fn(*args, **kwargs)
        except Exception as e:
            raise AuditCaptureError(_failure(fn, e, [str(w.message) for w in caught])) from e
        finally:
            restore_stream(dev, prev)
    for w in caught:  # passed on, now that the capture is over
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    report = rec.report(names=names)
    report.result, report.graph = result, g
    return report


def one_line(error):
    """An exception as one line: its type and the first line of its message."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"


def error_chain(e):
    """An error and the errors it was raised during, outermost first."""
    out = []
    while e is not None and all(e is not x for x in out):
        out.append(e)
        e = e.__cause__ or e.__context__
    return out


def rule_of_error(e):
    if isinstance(e, SimCaptureError):
        return e.rule
    text = str(e)
    for cuda_text, rule in CUDA_TEXTS.items():
        if cuda_text in text:
            if rule == "sync" and any(f.name == "query" for f in traceback.extract_tb(e.__traceback__)):
                return "query"
            return rule
    return None


def rule_of(e, warned=()):
    """The capture rule an error broke, or None: the first error of the chain that names one (a
    capture invalidated earlier fails later with 'a previous error', which names none), else a
    warning torch gave meanwhile (destroying a graph inside a capture only warns)."""
    rules = [rule_of_error(x) for x in reversed(error_chain(e))]  # the first error first
    for x, r in zip(reversed(error_chain(e)), rules):
        if r == "invalidated" and getattr(x, "cause", None):
            return x.cause
        if r is not None and r != "invalidated":
            return r
    if any(RULES["graph_destroyed"].cuda_text in w and "reset" in w for w in warned):
        return "graph_destroyed"
    return next((r for r in rules if r), None)


def _failure(fn, e, warned=()):
    name = getattr(fn, "__qualname__", None) or repr(fn)
    chain = error_chain(e)
    root = chain[-1]
    where = ""
    frames = [f for f in traceback.extract_tb(root.__traceback__) if not skip(f.filename)]
    if frames:
        f = frames[-1]
        where = f" at {os.path.basename(f.filename)}:{f.lineno} in {f.name}"
    notes = " ".join(getattr(root, "__notes__", []))
    msg = f"capturing {name} failed{where}: {type(root).__name__}: {root}" + (f" {notes}" if notes else "")
    if root is not e:
        msg += f"; then {one_line(e)}"
    rule = rule_of(e, warned)
    if rule is not None and rule in RULES:
        r = RULES[rule]
        msg += f" [rule {rule}: {r.says} ({r.cuda_error})]"
    return msg


def restore_stream(dev, prev):
    """Make `prev` the current stream again (torch.cuda.graph skips this when capture_end raises)."""
    if dev.current_stream() != prev:
        dev.set_stream(prev)
