"""Eager work on the simulator's clock: each kernel an eager op launches lasts what the replay timing
model gives the same node (latency + bytes moved / bandwidth; a paged op by its sequence lengths),
on the stream it was launched on, so an engine that times its eager steps with events sees them
take time, as on a GPU.

Each stream has a time its queued work ends (`StreamClocks.ready`); the host's time (`now`) moves
only when it waits (a synchronize). A kernel starts when its stream is free and not before the host
launched it; a replay is one long kernel on its stream; `wait_stream` and an event's wait make one
stream start no earlier than the other's work (or the event) ends. Eager kernels carry no jitter
and no launch overhead: what separates an eager step from a replay on a GPU's host (launch costs)
is not modelled, only the device's work."""

import torch

# private API, no public one: __torch_dispatch__ modes exist only in torch.utils._python_dispatch
from torch.utils._python_dispatch import TorchDispatchMode

# private API, no public one in torch (optree is the outside library); tests/test_private_api.py
from torch.utils._pytree import tree_flatten

from nblib.backends.opinfo import op_info
from nblib.backends.sim.arena import bytes_moved
from nblib.backends.sim.capture import has_cost, node_cost


class StreamClocks:
    """When each stream's queued work ends and what the host has waited for, in simulated seconds."""

    def __init__(self):
        self.now = 0.0  # the host's time: the latest end it waited for
        self.ready = {}  # stream -> when its queued work ends

    def start(self, stream):
        """When work launched now on `stream` can start."""
        return max(self.now, self.ready.get(stream, 0.0))

    def run(self, stream, seconds):
        """Queue `seconds` of work on `stream`."""
        self.ready[stream] = self.start(stream) + seconds

    def wait(self, stream, t):
        """Work queued on `stream` from now on starts no earlier than t."""
        self.ready[stream] = max(self.ready.get(stream, 0.0), t)

    def latest(self):
        """When all work queued so far ends."""
        return max([self.now, *self.ready.values()])

    def sync(self, stream=None):
        """The host waits for `stream` (None: every stream)."""
        self.host_waits(self.latest() if stream is None else self.ready.get(stream, 0.0))

    def host_waits(self, t):
        """The host waits until t (an event's synchronize)."""
        self.now = max(self.now, t)


def op_seconds(timing, func, args, kwargs, out):
    """One eager op's kernel under the timing model, without jitter: as a captured node's duration."""
    nbytes = bytes_moved(_tensors(args, kwargs.values(), out if isinstance(out, (list, tuple)) else (out,)))
    if has_cost(func):
        leaves, spec = tree_flatten((args, kwargs))
        return float(node_cost(func, leaves, spec, nbytes)(timing))
    # an op on empty tensors launches nothing
    return timing.latency + nbytes / timing.bandwidth if nbytes else 0.0


def _tensors(*groups):
    """The tensors among ops' arguments and results: an aten op's argument is a tensor, a list of
    them, or neither (no deeper nesting), so one level of lists suffices where a pytree walk per op
    costs the eager step more than its simulated kernels' bookkeeping."""
    for group in groups:
        for a in group:
            if isinstance(a, torch.Tensor):
                yield a
            elif isinstance(a, (list, tuple)):
                yield from (x for x in a if isinstance(x, torch.Tensor))


class EagerTiming(TorchDispatchMode):
    """Pushed by dev.eager_timing(): each eager op that launches a kernel (not a view, not a bare
    allocation) runs, then occupies its stream for op_seconds. Ops a graph replay runs are the
    replay's (timed as its span), and a capture records rather than runs: neither is timed here."""

    def __init__(self, dev):
        super().__init__()
        self.dev = dev

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        dev = self.dev
        if dev.replaying or dev.is_capturing() or op_info(func).kind != "node":
            return out
        dev.streams.run(dev.current_stream(), op_seconds(dev.timing, func, args, kwargs, out))
        return out
