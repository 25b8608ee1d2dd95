"""The audit's zoo: small multi-stream capture scenarios, each a planted race with a correctly
synchronised twin, runnable on both backends through the device facade.

    rows = audit_zoo.run(dev)                 # every case, race and twin, plain and audited
    [r for r in rows if not r.right]          # wrong verdicts (the goal: none, and no false alarm)

Each case builds its persistent tensors and streams outside the capture and returns the functions
to capture (usually one; two for the shared-pool case), all captured into one graph pool. `racy`
picks the planted race or its twin; the twin differs by the one sync (or layout) that fixes it.
Every race here arises from the real mechanism: unordered kernels on two streams touching the same
bytes, sometimes through the caching allocator handing a freed block to the next tensor.

Each scenario is captured twice, without and with the recorder: a capture that succeeds plainly
must succeed audited too (the audit never breaks a legal capture), and the audited verdict must be
the expected one: a race of the expected kind for the planted case, nothing for its twin.
"""

from nblib.instruments.audit.zoo import reuse, streams, syncs  # noqa: F401  (importing them registers the cases)
from nblib.instruments.audit.zoo.base import CASES, Case, N
from nblib.instruments.audit.zoo.runner import ZooRow, capture_all, graph_check, run, run_one, summary

__all__ = ["CASES", "N", "Case", "ZooRow", "capture_all", "graph_check", "run", "run_one", "summary"]
