"""The graphed canary: the canary's per-replay device work captured into two CUDA graphs per bucket.

The eager canary (nblib.instruments.canary) issues some twenty small ops and one sync (sizing the
watched ids) around each replay; the GPU idles while the host launches them. Here every op has a
fixed shape, so each bucket's work is captured once and a replay costs two graph launches and one
small device-to-host copy, with no host sync at all:

  before graph   checksum every page into a fixed buffer (the step's pages are not known yet:
                 runner.run fills the bucket's StaticBatch after before())
  after graph    checksum every page again; from the StaticBatch's page_table, seq_lens and
                 store_slots, the class of each page (canary.page_classes) and the watched mask
                 (live, expected, scratch, and a fixed-k free sample: torch.rand keys on the default
                 CUDA generator, which capture supports, each replay advancing its offset); changed
                 = watched pages whose checksum moved; the first `cap` of them packed with the counts
                 into one int64 buffer, copied to the host without waiting

after() leaves the copy in flight and returns: the step's record is built from it at the next
after() (the host's work then overlaps the next replay) or when `records` is read, so the GPU never
waits for the host between replays. More than `cap` changed pages take a second transfer (the
changed pages themselves), as the eager canary's changed_pages does. The records are the eager
canary's for the same pages watched; the free sample differs in which pages (drawn after the
replay rather than before, independently of the cache's contents), not how many. Reproducible from
torch.cuda.manual_seed.

    canary = GraphedCanary(runner)             # the runner whose StaticBatch tensors it reads
    run_sessions(runner, w, instruments=[canary])

Off CUDA the same functions run eagerly (what the CPU tests hold to the eager canary's answers).
"""

from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch

from nblib.engine.model import PAGE
from nblib.engine.runner import Runner, bucket_for
from nblib.instruments import canary as C

if TYPE_CHECKING:
    from nblib.backends.device import Device

__all__ = ["FREE", "GraphedCanary", "batch_classes", "pack_changed", "unpack", "watched_mask"]

FREE = 4  # page_classes' code for a page in no live range and not expected: the unwatched unless sampled


def batch_classes(
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    store_slots: torch.Tensor,
    num_pages: int,
    use_table: torch.Tensor | None = None,
    live_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """int64 [num_pages]: canary.page_classes from a StaticBatch's tensors, in fixed shapes. Live
    pages: page_table[r, :ceil(seq_len / 64)] while use_table (bool [1], or None: always) holds,
    plus those in live_mask (bool [num_pages], run_sessions' live_pages) still free: the eager
    canary's live_pages when given, else the batch's."""
    live = C.table_live(page_table, seq_lens, use_table)
    cls = C.page_classes(live, store_slots.long() // PAGE, num_pages)
    if live_mask is not None:
        cls = torch.where(live_mask & (cls == FREE), 3, cls)
    return cls


def watched_mask(classes: torch.Tensor, k: int | None, gen: torch.Generator | None = None) -> torch.Tensor:
    """bool [pages]: the pages the eager canary's watched() returns, as a mask: every page not FREE
    plus min(k, free) free pages drawn by canary.sample_free (k None: every page)."""
    if k is None:
        return torch.ones_like(classes, dtype=torch.bool)
    keep = classes != FREE
    if k:
        keep.index_fill_(0, C.sample_free(keep, k, gen), True)
    return keep


def pack_changed(
    changed: torch.Tensor, classes: torch.Tensor, watched: torch.Tensor, cap: int = C.CHANGED_CAP
) -> torch.Tensor:
    """canary.pack of every page: counts changed, expected (distinct pages of class 1) and watched,
    then the first `cap` changed pages ascending as page * 8 + class code."""
    ids = torch.arange(changed.shape[0], device=changed.device)
    counts = (changed.sum(), (classes == 1).sum(), watched.sum())
    return C.pack(changed, ids * 8 + classes, counts, cap)


def unpack(host: np.ndarray, cap: int = C.CHANGED_CAP) -> tuple[Any, ...]:
    """(changed, expected, watched, pages, codes) from pack_changed's buffer (numpy); pages and
    codes None when more than `cap` changed (they were not all packed)."""
    counts, pages, codes = C.unpack(host, 3, cap)
    return (*counts, pages, codes)


class _InFlight(NamedTuple):
    """A replay whose answer is still being copied to the host (GraphedCanary.after)."""

    step: Mapping[str, Any]
    changed: torch.Tensor  # the after graph's outputs, read if more than cap pages changed
    classes: torch.Tensor
    packed: torch.Tensor  # the packed answer on the host (CUDA: once `copied` has passed)
    copied: Any  # CUDA: an event behind the copy; None where the answer is already on the host


class _Graphed:
    """fn() captured into a CUDA graph through the device facade `dev` (after one warm-up on a side
    stream, which compiles the Triton kernel), on its own private pool so the canary never shares
    the model's blocks; calling replays it and returns the captured outputs. dev None: fn() itself."""

    def __init__(self, fn: Callable[[], Any], dev: "Device | None" = None):
        self.fn, self.graph = fn, None
        if dev is not None:
            side = dev.Stream()
            side.wait_stream(dev.current_stream())
            with dev.stream(side):
                fn()
            dev.current_stream().wait_stream(side)
            dev.synchronize()
            self.graph = dev.CUDAGraph()
            with dev.graph(self.graph):
                self.out = fn()
            dev.synchronize()

    def __call__(self) -> Any:
        if self.graph is None:
            return self.fn()
        self.graph.replay()
        return self.out


class GraphedCanary(C.Canary):
    """The canary with its device work in CUDA graphs (see the module docstring); the same records,
    summary and describe() as Canary. Reads the runner's StaticBatch tensors, so it instruments that
    runner's replays only (run_sessions, overhead.replay_times). capture: None captures on CUDA
    only; True captures through the simulator's facade too (its capture refuses host syncs, as
    CUDA's does), the free sample then from the default generator as on CUDA."""

    def __init__(
        self,
        runner: Runner,
        free_sample: int | None = C.FREE_SAMPLE,
        seed: int = 0,
        cap: int = C.CHANGED_CAP,
        capture: bool | None = None,
    ):
        super().__init__(runner.model, free_sample=free_sample, seed=seed)
        self.runner, self.cap = runner, cap
        self.cuda = self.cache.device.type == "cuda"
        self.graphed = self.cuda if capture is None else bool(capture)
        d, pages = self.cache.device, self.cache.shape[0]
        self._all = torch.arange(pages, device=d)  # every page id, made here: capture allocates none
        self._start = torch.zeros(pages, dtype=torch.int64, device=d)  # before()'s checksums
        self._use_table = torch.ones(1, dtype=torch.bool, device=d)  # the after graph's inputs
        self._live = torch.zeros(pages, dtype=torch.bool, device=d)
        self._host_live = torch.zeros(pages, dtype=torch.bool, pin_memory=self.cuda)
        self._live_sent: Any = None  # CUDA: an event behind _host_live's last copy to the device
        self._given = False  # whether _live holds a step's live_pages now
        self._graphs: dict[int, tuple[_Graphed, _Graphed]] = {}
        self._bucket: int | None = None
        self._pending: _InFlight | None = None  # the last replay's answer, in flight
        if self.cuda:  # the copy's pinned target, reused: flush() has read it before the next copy
            self._host_packed = torch.zeros(cap + 3, dtype=torch.int64, pin_memory=True)

    @property
    def records(self) -> list[dict[str, Any]]:
        """One dict per replay, as the eager canary's; reading it builds the last replay's."""
        self.flush()
        return self._records

    @records.setter
    def records(self, value: list[dict[str, Any]]) -> None:
        self._records = value

    def _capture(self, bucket):
        st, cache, gen = self.runner.static[bucket], self.cache, None if self.graphed else self._rng

        def before():
            self._start.copy_(C.page_checksums(cache, self._all))

        def after():
            now = C.page_checksums(cache, self._all)
            classes = batch_classes(
                st.page_table, st.seq_lens, st.store_slots, cache.shape[0], self._use_table, self._live
            )
            watched = watched_mask(classes, self.free_sample, gen)
            changed = (now != self._start) & watched
            return changed, classes, pack_changed(changed, classes, watched, self.cap)

        dev = self.runner.dev if self.graphed else None
        return _Graphed(before, dev), _Graphed(after, dev)

    def capture(self, *buckets: int) -> "GraphedCanary":
        """Capture these buckets' graphs now (default: all the runner's); else each is captured on
        its bucket's first before(), whose replay then pays for it."""
        for b in buckets or self.runner.buckets:
            if b not in self._graphs:
                self._graphs[b] = self._capture(b)
        return self

    def _set_live(self, live_pages: torch.Tensor | Collection[int] | None) -> None:
        """run_sessions' live_pages into the after graph's live mask (pinned, non-blocking: no sync);
        the previous step's copy has finished, as after() waited for the transfer behind it."""
        if live_pages is None:
            if self._given:
                self._use_table.fill_(True)
                self._live.zero_()
                self._given = False
            return
        if self._live_sent is not None:  # the last copy out of _host_live has been made
            self._live_sent.synchronize()
        self._host_live.zero_()
        self._host_live[C.as_index(live_pages, "cpu")] = True
        self._live.copy_(self._host_live, non_blocking=self.cuda)
        if self.cuda:
            self._live_sent = self.runner.dev.Event()
            self._live_sent.record()
        if not self._given:
            self._use_table.fill_(False)
            self._given = True

    def before(self, step: Mapping[str, Any] | None = None) -> None:
        if step is None:
            raise ValueError("the graphed canary needs the step (its bucket and live_pages)")
        b = bucket_for(len(step["tokens"]), self.runner.buckets)
        self.capture(b)  # once per bucket (syncs), before the replay
        self._graphs[b][0]()
        self._set_live(step.get("live_pages"))  # host work while the before graph runs
        self._bucket = b

    def after(self, step: Mapping[str, Any]) -> None:  # type: ignore[override]  # the record comes later
        """Replays the bucket's after graph and starts the answer's copy to the host; the record
        comes later (the module docstring). Returns None: read `records`."""
        if self._bucket is None:
            raise RuntimeError("canary.after() without canary.before(): no checksums to compare with")
        self.flush()  # the last replay's record, while the GPU runs this one; frees its buffers
        changed, classes, packed = self._graphs[self._bucket][1]()
        self._bucket = None
        done = None
        if self.cuda:
            packed = self._host_packed.copy_(packed, non_blocking=True)
            done = self.runner.dev.Event()
            done.record()
        self._pending = _InFlight(step, changed, classes, packed, done)

    def flush(self) -> None:
        """Build the record of the replay whose answer is in flight, if any (waits for its copy)."""
        if self._pending is None:
            return
        p, self._pending = self._pending, None
        if p.copied is not None:
            p.copied.synchronize()
        n_changed, n_expected, n_watched, pages, codes = unpack(p.packed.numpy(), self.cap)
        if pages is None:  # more than cap changed: a second transfer, as changed_pages does
            got = (self._all * 8 + p.classes)[p.changed].cpu().numpy()
            pages, codes = got >> 3, got & 7
        rec = C.record(p.step, len(self._records), n_watched, n_changed, n_expected, pages, codes)
        self._records.append(rec)
