"""Error parity between the simulator and CUDA: what a capture forbids, case by case.

    rows = audit_parity.run(dev)      # one ParityRow per case: what happened, the rule, captures again?

Each case breaks one rule of stream capture (nblib.backends.capture_rules) inside an otherwise legal
capture, through the device facade, so the same code runs on both backends. The runner records
whether the capture failed, the error's kind and first line, the rule the error itself names
("invalidated" where an earlier call broke the capture), the rule the audit names for it, and
whether the process captures (and replays) a legal graph right afterwards: no sticky state.
scripts/gpu_audit_zoo.py runs the cases on the H200; the table puts both columns side by side.

What CUDA does is recorded per rule (Rule.reported): most illegal calls fail at the call; some
(merge, graph_destroyed) are accepted and only invalidate the capture, so the next call fails with
"invalidated" (the simulator does the same, and its error keeps the cause); work on a stream outside
the capture (uncaptured_stream, legacy) CUDA runs eagerly, outside the graph, without an error,
where the simulator refuses it: a documented difference.
"""

import contextlib
import gc
import os
import sys
import tempfile
import warnings
from dataclasses import dataclass

import torch

from nblib.backends.capture_rules import AT_NEXT_CALL, EAGER, RULES
from nblib.instruments import audit

N = 1024


@dataclass(frozen=True)
class Case:
    name: str
    rule: str  # the rule it breaks (nblib.backends.capture_rules.RULES), or "legal"
    run: object  # run(dev): capture something that breaks the rule


CASES = []


def case(rule):
    def register(fn):
        CASES.append(Case(fn.__name__, rule, fn))
        return fn

    return register


def _ones(dev):
    return torch.ones(N, device=dev.torch_device)


def _capture(dev, body, **graph_kwargs):
    g = dev.CUDAGraph()
    with dev.graph(g, **graph_kwargs):
        body()
    return g


@case("sync")
def device_synchronize(dev):
    x = _ones(dev)
    _capture(dev, lambda: (x * 2, dev.synchronize()))


@case("sync")
def stream_synchronize(dev):
    x = _ones(dev)
    _capture(dev, lambda: (x * 2, dev.current_stream().synchronize()))


@case("sync")
def item(dev):
    x = _ones(dev)
    _capture(dev, lambda: (x * 2).sum().item())


@case("query")
def stream_query(dev):
    x = _ones(dev)
    _capture(dev, lambda: (x * 2, dev.current_stream().query()))


@case("captured_event")
def captured_event_query(dev):
    x = _ones(dev)

    def body():
        ev = dev.Event()
        x.mul_(2)
        ev.record()
        ev.query()

    _capture(dev, body)


@case("captured_event")
def captured_event_synchronize(dev):
    x = _ones(dev)

    def body():
        ev = dev.Event()
        x.mul_(2)
        ev.record()
        ev.synchronize()

    _capture(dev, body)


@case("isolation")
def wait_on_an_event_recorded_before_the_capture(dev):
    x, side, ev = _ones(dev), dev.Stream(), dev.Event()
    with dev.stream(side):
        x.mul_(2)
    ev.record(side)

    def body():
        dev.current_stream().wait_event(ev)
        x.add_(1)

    _capture(dev, body)


@case("isolation")
def wait_stream_on_a_stream_outside_the_capture(dev):
    x, idle = _ones(dev), dev.Stream()

    def body():
        x.add_(1)
        dev.current_stream().wait_stream(idle)

    _capture(dev, body)


@case("merge")
def wait_on_an_event_of_an_earlier_capture(dev):
    """CUDA accepts the wait and invalidates the capture: x.add_ fails, "invalidated"."""
    x, ev = _ones(dev), dev.Event()

    def first():
        x.mul_(2)
        ev.record()

    g1 = _capture(dev, first)

    def second():
        dev.current_stream().wait_event(ev)
        x.add_(1)

    _capture(dev, second, pool=g1.pool())


@case("unjoined")
def side_stream_not_joined(dev):
    x, side = _ones(dev), dev.Stream()

    def body():
        side.wait_stream(dev.current_stream())
        with dev.stream(side):
            x.mul_(2)

    _capture(dev, body)


@case("legacy")
def work_on_the_default_stream(dev):
    """CUDA captures without an error: torch's streams are non-blocking, so the add runs eagerly
    on the legacy stream, outside the graph (measured on the H200); the simulator refuses it."""
    x = _ones(dev)

    def body():
        x.mul_(2)
        with dev.stream(dev.default_stream):
            x.add_(1)

    _capture(dev, body)


@case("uncaptured_stream")
def work_on_a_stream_that_never_joined(dev):
    """CUDA captures without an error: the add runs eagerly, outside the graph."""
    x, other = _ones(dev), dev.Stream()

    def body():
        x.mul_(2)
        with dev.stream(other):
            x.add_(1)  # in place: no allocation

    _capture(dev, body)


@case("default_stream")
def capture_on_the_default_stream(dev):
    x, g = _ones(dev), dev.CUDAGraph()
    g.capture_begin()
    try:
        x.mul_(2)
    finally:
        g.capture_end()


@case("end_stream")
def end_on_another_stream(dev):
    x, s1, s2, g = _ones(dev), dev.Stream(), dev.Stream(), dev.CUDAGraph()
    with dev.stream(s1):
        g.capture_begin()
        x.mul_(2)
    try:
        with dev.stream(s2):
            g.capture_end()
    finally:
        with dev.stream(s1):  # the capture is still underway on s1: end it there
            if dev.is_current_stream_capturing():
                with contextlib.suppress(Exception):
                    g.capture_end()


@case("graph_destroyed")
def a_graph_destroyed_while_capturing(dev):
    """An earlier graph kept alive only by a reference cycle; the collector runs inside a capture."""
    x = _ones(dev)
    was = gc.isenabled()
    gc.disable()  # the collector runs inside the capture below, not before it
    try:
        old = _capture(dev, lambda: x.mul_(2))
        cycle = [old]
        cycle.append(cycle)
        del old, cycle
        _capture(dev, lambda: (x.add_(1), gc.collect()))
    finally:
        if was:
            gc.enable()


@case("legal")
def wait_on_an_event_never_recorded(dev):
    x, ev = _ones(dev), dev.Event()
    _capture(dev, lambda: (dev.current_stream().wait_event(ev), x.mul_(2)))


@case("legal")
def fork_and_join(dev):
    x, side = _ones(dev), dev.Stream()

    def body():
        side.wait_stream(dev.current_stream())
        with dev.stream(side):
            y = x * 2
        dev.current_stream().wait_stream(side)
        return y

    _capture(dev, body)


# ------------------------------------------------------------------------------------------------


@dataclass
class ParityRow:
    case: str
    rule: str  # the rule the case breaks ("legal": none)
    backend: str
    outcome: str  # "ok" | "error"
    error: str = ""  # the error's type and first line
    error_rule: str = ""  # the rule the first error names itself ("invalidated": a call before broke it)
    named_rule: str = ""  # the rule the audit names for that error (an invalidated one: its cause)
    warnings: str = ""  # warnings raised meanwhile (torch's CUDA warnings: e.g. in a destructor)
    captures_again: bool = None  # a legal capture right afterwards captures and replays


def probe(dev):
    """A legal capture with a fork and a join, replayed and checked: True if the device is usable."""
    x, side = torch.arange(N, dtype=torch.float32, device=dev.torch_device), dev.Stream()
    g = dev.CUDAGraph()
    with dev.graph(g):
        side.wait_stream(dev.current_stream())
        with dev.stream(side):
            y = x * 2
        dev.current_stream().wait_stream(side)
        z = y + 1
    g.replay()
    dev.synchronize()
    return bool(torch.equal(z, x * 2 + 1))


@contextlib.contextmanager
def stderr_lines():
    """The lines written to file descriptor 2 meanwhile: torch's C++ warnings (a destructor's
    "operation not permitted when stream is capturing (function reset)") bypass Python's."""
    lines = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield lines
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            lines.extend(x.strip() for x in tmp.read().splitlines() if x.strip())


def error_rule(e):
    """The rule the first error of the chain names by itself, without an invalidated error's cause
    or torch's warnings: "invalidated" where the call that failed was not the one that broke the
    capture."""
    chain = audit.error_chain(e)
    return next((r for r in map(audit.rule_of_error, reversed(chain)) if r), "")


def _first_line(e):
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"[:300]


def run_one(dev, c):
    row = ParityRow(c.name, c.rule, dev.name, "ok")
    prev = dev.current_stream()
    failure = None
    with stderr_lines() as err, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            c.run(dev)
        except Exception as e:
            row.outcome, row.error, failure = "error", _first_line(e), e
        finally:
            audit.restore_stream(dev, prev)
    warned = [str(w.message).splitlines()[0] for w in caught] + err
    if failure is not None:
        row.named_rule = audit.rule_of(failure, warned) or ""
        row.error_rule = error_rule(failure)
    # drop the error now: its traceback holds this frame, which holds it (a cycle), and the case's
    # frames, whose graphs would then wait for the collector, which may run inside a later capture
    failure = None
    row.warnings = " | ".join(w[:200] for w in warned)
    try:
        row.captures_again = probe(dev)
    except Exception as e:
        row.captures_again = False
        row.warnings += f" | probe: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return row


def run(dev, cases=None):
    return [run_one(dev, c) for c in CASES if cases is None or c.name in cases]


def same_failure(s, c):
    """The simulator's row `s` and CUDA's row `c` of one case fail the same way: the same outcome,
    and the same rule named, or CUDA's "invalidated" where the rule is one CUDA reports at the next
    call and the simulator's error is the invalidated one that rule caused."""
    if c.outcome != s.outcome:
        return False
    if c.named_rule == s.named_rule:
        return True
    rule = RULES.get(s.rule)
    return (
        rule is not None
        and rule.reported == AT_NEXT_CALL
        and c.named_rule == "invalidated"
        and s.error_rule == "invalidated"
        and s.named_rule == s.rule
    )


def as_documented(c):
    """CUDA's row `c` does what the rules record: a legal case captures; a rule CUDA never reports
    (it runs the work eagerly) captures too; any other fails naming its rule, or "invalidated"
    where CUDA reports the rule at the next call. And the process captures again afterwards."""
    rule = RULES.get(c.rule)
    if c.rule == "legal" or (rule is not None and rule.reported == EAGER):
        ok = c.outcome == "ok"
    else:
        names = {c.rule, "invalidated"} if rule is not None and rule.reported == AT_NEXT_CALL else {c.rule}
        ok = c.outcome == "error" and c.named_rule in names
    return ok and bool(c.captures_again)


def table(sim_rows, cuda_rows):
    """Rows of the parity table: rule, case, what CUDA did, what the simulator did, the same kind of
    failure? (same_failure), when CUDA reports the rule, and for a rule CUDA never reports (it runs
    the work eagerly, outside the graph, where the simulator refuses it) the documented difference.
    as_documented: CUDA's row does what the rules record (None where the CUDA column is not CUDA's,
    as in the dry run on the simulator)."""
    cuda = {r.case: r for r in cuda_rows}
    out = []
    for s in sim_rows:
        c = cuda.get(s.case)
        rule = RULES.get(s.rule)
        reported = rule.reported if rule else ""
        out.append(
            dict(
                case=s.case,
                rule=s.rule,
                cuda=(c.error or "captured") if c else "not measured",
                cuda_rule=c.named_rule if c else "",
                cuda_captures_again=c.captures_again if c else None,
                sim=s.error or "captured",
                sim_rule=s.named_rule,
                sim_captures_again=s.captures_again,
                same=c is not None and same_failure(s, c),
                cuda_reports=reported,
                documented_difference=(
                    f"CUDA: {rule.cuda_error}; the simulator refuses it" if reported == EAGER else ""
                ),
                as_documented=as_documented(c) if c is not None and c.backend == "cuda" else None,
            )
        )
    return out
