"""The canary: did a replay write into index-K cache pages it had no business touching?

The campaign's first suspect was the index-K cache itself: a replayed graph storing entries into
the wrong pages would corrupt later steps' top-k. The canary takes a checksum of every cache page
right before a replay and right after it, and classes each page that changed:

  expected        a page the step stores new entries into (store_slots // 64, for rows that
                  store; page 0, the scratch page, is never expected)
  scratch         page 0: rows with nothing to store (and padding rows) write its last slot
  live overwrite  a page inside some request's live range that was not expected to change: the
                  alarm (later steps read those entries)
  free write      a page in no request's live range, not expected: stray, harmless until reused

    canary = Canary(model)                     # watches model.index_cache, refuses anything else
    run_sessions(runner, w, instruments=[canary])
    canary.summary()                           # pages changed / expected / outside / live overwrites

It reads the cache and never writes it. By default it watches the pages that matter, not the whole
cache: every page in some request's live range, the pages the step stores into, the scratch page,
and a fresh sample of FREE_SAMPLE free pages each replay, so a live overwrite is always caught and a
stray free-page write is caught in proportion. `free_sample=None` checksums every page (the
campaign's canary). On CUDA the checksums are one Triton kernel over the chosen pages
(kernels.checksum), on the current stream after the replay.

The host's work per replay is a fixed number of tensor ops on the cache's device, whatever the
batch's page count: the watched pages are a mask built from the page table (or the step's
live_pages) in one scatter, the free sample is the smallest keys of one random draw per page, the
before checksums stay on the device, and after() classifies the changed pages there and brings back
their ids and classes (usually a handful) with the counts in one transfer. Two syncs: torch.nonzero
sizing the watched ids in before(), that transfer in after(). expected_pages, batch_live_pages,
_live and classify are the host definitions the device path reproduces (the tests hold it to them).
"""

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from kernels import checksum as ck
from nblib.engine import build, references
from nblib.engine.model import PAGE, DecodeModel
from nblib.engine.runner import Runner

if TYPE_CHECKING:
    from nblib.backends.device import Device

__all__ = [
    "CHANGED_CAP",
    "CLASSES",
    "FREE_SAMPLE",
    "SCRATCH_PAGE",
    "Canary",
    "as_index",
    "batch_live_pages",
    "changed_pages",
    "classify",
    "describe",
    "expected_pages",
    "host_page_checksums",
    "pack",
    "page_checksums",
    "page_classes",
    "record",
    "sample_free",
    "step_pages",
    "table_live",
    "unpack",
    "verdict",
    "watch",
]

SCRATCH_PAGE = 0
CLASSES = ("expected", "scratch", "live_overwrite", "free_write")
FREE_SAMPLE = 64  # free pages checksummed per replay, drawn afresh each time
_CHUNK_WORDS = 1 << 20  # the CPU path's int64 temporary: 8 MB (256 bf16 pages of 64 x 128)


def _words(cache):
    """The cache as [pages, words] of int32: bf16 [P, 64, D] and fp8 [P, bytes] alike."""
    flat = cache.reshape(cache.shape[0], -1)
    if (flat.shape[1] * flat.element_size()) % 4:
        raise ValueError(
            f"a cache page of {flat.shape[1] * flat.element_size()} bytes is not whole 32-bit words"
        )
    return flat.view(torch.uint8).view(torch.int32) if flat.element_size() != 4 else flat.view(torch.int32)


def page_checksums(cache: torch.Tensor, page_ids: torch.Tensor | None = None) -> torch.Tensor:
    """One int64 per page (all pages, or those in page_ids): sum of its 32-bit words, each times an
    odd, position-dependent weight (so a moved or swapped entry changes it too). Wraps on overflow,
    identically on CPU and CUDA. CUDA: the Triton kernel; CPU: torch, in chunks of 2^20 words."""
    if page_ids is None:
        page_ids = torch.arange(cache.shape[0], device=cache.device)
    if cache.device.type == "cuda":
        return ck.page_checksums(cache, page_ids.to(cache.device))
    words = _words(cache)
    n = words.shape[1]
    weight = torch.arange(n, device=cache.device, dtype=torch.int64) * 2654435761 + 0x9E3779B9
    weight |= 1
    out = torch.empty(page_ids.shape[0], dtype=torch.int64, device=cache.device)
    chunk = max(1, _CHUNK_WORDS // n)
    for lo in range(0, page_ids.shape[0], chunk):
        hi = min(lo + chunk, page_ids.shape[0])
        out[lo:hi] = (words[page_ids[lo:hi]].to(torch.int64) * weight).sum(1)
    return out


def host_page_checksums(cache: torch.Tensor, page_ids: torch.Tensor | None = None) -> torch.Tensor:
    """page_checksums, for a caller outside any graph capture: the same int64 per page. On the CPU,
    numpy's einsum multiplies and sums each page's words in one pass (int64 products, wrapping as
    torch's do), about 3x faster than the int64 temporary; elsewhere page_checksums itself. Never
    inside a capture: numpy reads the bytes when called, not when the graph replays."""
    if cache.device.type != "cpu":
        return page_checksums(cache, page_ids)
    words = _words(cache).numpy()
    if page_ids is not None:
        words = words[page_ids.numpy()]
    weight = np.arange(words.shape[1], dtype=np.int64) * 2654435761 + 0x9E3779B9
    weight |= 1
    return torch.from_numpy(np.einsum("pw,w->p", words, weight, dtype=np.int64))


def expected_pages(store_slots: torch.Tensor) -> set[int]:
    """Pages that receive a new entry this step: store_slots // 64, scratch page excluded."""
    pages = (store_slots.to("cpu", torch.int64) // PAGE).tolist()
    return {p for p in pages if p != SCRATCH_PAGE}


def batch_live_pages(page_table: torch.Tensor, seq_lens: torch.Tensor) -> set[int]:
    """Live pages of the batch's requests alone: page_table[r, :ceil(seq_len / 64)], scratch excluded.
    (run_sessions passes the wider set: every unfinished session's pages.)"""
    table, lens = page_table.to("cpu"), seq_lens.to("cpu").tolist()
    live: set[int] = set()
    for r, n in enumerate(lens):
        live.update(table[r, : -(-int(n) // PAGE)].tolist())
    live.discard(SCRATCH_PAGE)
    return live


def _live(step):
    """The step's live pages: run_sessions passes every unfinished session's; else the batch's."""
    live = step.get("live_pages")
    return live if live is not None else batch_live_pages(step["page_table"], step["seq_lens"])


def as_index(pages: torch.Tensor | Collection[int], device: torch.device | str) -> torch.Tensor:
    """Page ids given as a tensor, or as a set or list of ints (run_sessions' live_pages): an int64
    tensor on `device` (numpy reads a set of 14000 ints some 8x faster than torch.tensor)."""
    if isinstance(pages, torch.Tensor):
        return pages.to(device=device, dtype=torch.long)
    return torch.from_numpy(np.fromiter(pages, dtype=np.int64, count=len(pages))).to(device)


def step_pages(step: Mapping[str, Any], device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """(live, stores): page ids (int32 or int64) on `device`, from tensor ops alone. live: the step's
    live_pages, else the batch's page_table[r, :ceil(seq_len / 64)] (page 0 where a row holds
    fewer); stores: store_slots // 64. Either may hold duplicates and the scratch page."""
    given = step.get("live_pages")
    if given is not None:
        live = as_index(given, device)
    else:
        live = table_live(step["page_table"].to(device), step["seq_lens"].to(device))
    return live, step["store_slots"].to(device, torch.int64) // PAGE


def table_live(
    page_table: torch.Tensor, seq_lens: torch.Tensor, use: torch.Tensor | None = None
) -> torch.Tensor:
    """page_table[r, :ceil(seq_len / 64)] as one flat tensor of page ids, fixed-shape: page 0 where
    a row holds fewer (and everywhere while `use`, a bool tensor, is False)."""
    first = torch.arange(0, page_table.shape[1] * PAGE, PAGE, device=page_table.device)
    held = first < seq_lens[:, None]  # column c < ceil(n / 64): c's first entry is held
    if use is not None:
        held = held & use
    return torch.where(held, page_table, SCRATCH_PAGE).flatten()


def page_classes(live: torch.Tensor, stores: torch.Tensor, num_pages: int) -> torch.Tensor:
    """int64 [num_pages]: the class each page would get from classify if it changed, as 1 + its
    index in CLASSES (expected 1, scratch 2, live_overwrite 3, free_write 4), from step_pages'
    ids in four ops. A page's duplicates all write the same value; later writes take precedence,
    as classify's earlier tests do. index_fill_ and fill_ are kernels, so a CUDA graph can capture
    them (tensor[idx] = 3 may stage the 3 through a host copy, which capture refuses)."""
    cls = torch.full((num_pages,), 4, dtype=torch.int64, device=live.device)
    cls.index_fill_(0, live.long(), 3)
    cls.index_fill_(0, stores.long(), 1)
    cls.narrow(0, SCRATCH_PAGE, 1).fill_(2)  # never expected: its writes are the scratch slot's
    return cls


def sample_free(keep: torch.Tensor, k: int, gen: torch.Generator | None) -> torch.Tensor:
    """min(k, pages) distinct page ids: min(k, free) of them drawn uniformly without replacement
    from the pages not in `keep` (bool [pages]), the rest (only when fewer are free) pages of keep.
    The k smallest of one uniform key per page, kept pages' keys pushed past every free one: a
    fixed-size draw (no sync, no permutation of the free pages); `gen` on keep's device."""
    keys = torch.rand(keep.shape[0], generator=gen, device=keep.device, dtype=torch.float64)
    keys.masked_fill_(keep, 2.0)
    return torch.topk(keys, min(k, keep.shape[0]), largest=False, sorted=False).indices


CHANGED_CAP = 512  # changed pages brought back in after()'s one transfer; more take a second


def pack(
    changed: torch.Tensor,
    enc: torch.Tensor,
    counts: tuple[torch.Tensor, ...] | list[torch.Tensor],
    cap: int = CHANGED_CAP,
) -> torch.Tensor:
    """int64 [len(counts) + cap]: the counts (0-dim tensors), then enc where changed, the first
    `cap` of them in order, -1 past them: what after() brings back in one transfer, fixed-shape."""
    head = len(counts)
    pos = torch.cumsum(changed, 0) - 1
    slot = torch.where(changed & (pos < cap), pos + head, cap + head)  # cap + head: a bin, dropped
    out = torch.full((cap + head + 1,), -1, dtype=torch.int64, device=changed.device)
    out.scatter_(0, slot, enc)
    out[:head] = torch.stack(counts)  # device to device
    return out[: cap + head]


def unpack(
    host: np.ndarray, head: int, cap: int = CHANGED_CAP
) -> tuple[tuple[int, ...], np.ndarray | None, np.ndarray | None]:
    """(counts, pages, codes) from pack's buffer (numpy), enc being page * 8 + class code; pages and
    codes None when more than `cap` changed (the first count), as they were not all packed."""
    counts = tuple(int(x) for x in host[:head])
    if counts[0] > cap:
        return counts, None, None
    got = host[head : head + counts[0]]
    return counts, got >> 3, got & 7


def changed_pages(
    changed: torch.Tensor, ids: torch.Tensor, classes: torch.Tensor, cap: int = CHANGED_CAP
) -> tuple[int, int, Any, Any]:
    """(changed count, distinct expected pages, pages, codes): the changed pages among `ids`
    (ascending, numpy) and their page_classes codes, brought back with the counts in one
    transfer of cap + 2 int64 (a second when more than `cap` changed)."""
    enc = ids * 8 + classes[ids]
    host = pack(changed, enc, (changed.sum(), (classes == 1).sum()), cap).cpu().numpy()
    (n_changed, n_expected), pages, codes = unpack(host, 2, cap)
    if pages is None:
        got = enc[changed].cpu().numpy()
        pages, codes = got >> 3, got & 7
    return n_changed, n_expected, pages, codes


def record(
    step: Mapping[str, Any],
    n_before: int,
    watched: int,
    n_changed: int,
    n_expected: int,
    pages: np.ndarray,
    codes: np.ndarray,
) -> dict[str, Any]:
    """One step's record from changed_pages' answer (pages and their codes, numpy); n_before: the
    records already kept (the step's index when it has none). The eager and graphed canaries share it."""
    by = {c: pages[codes == i + 1].tolist() for i, c in enumerate(CLASSES)}
    return dict(
        step=step.get("index", n_before),
        bucket=step.get("bucket"),
        bs=step.get("bs"),
        watched=watched,
        changed=n_changed,
        expected=n_expected,
        expected_unchanged=n_expected - len(by["expected"]),
        outside_live=len(by["scratch"]) + len(by["free_write"]),
        live_overwrites=by["live_overwrite"],
        free_writes=by["free_write"],
        scratch=bool(by["scratch"]),
    )


def classify(changed: Iterable[int], expected: Collection[int], live: Collection[int]) -> dict[int, str]:
    """{page: class} for each changed page (see the module docstring)."""
    out = {}
    for p in changed:
        if p in expected:
            out[p] = "expected"
        elif p == SCRATCH_PAGE:
            out[p] = "scratch"
        elif p in live:
            out[p] = "live_overwrite"
        else:
            out[p] = "free_write"
    return out


class Canary:
    """Per-page checksums of the model's index-K cache around each replay (an instrument for
    run_sessions: before(step), after(step)); `records` holds one dict per step.

    The sample of free pages is drawn with a generator on the cache's device, seeded by `seed`: a
    fresh sample each replay, the same sequence of samples for the same seed and steps."""

    def __init__(
        self,
        model: DecodeModel,
        tensor: torch.Tensor | None = None,
        free_sample: int | None = FREE_SAMPLE,
        seed: int = 0,
    ):
        cache = model.index_cache
        if tensor is not None and not (
            tensor is cache
            or (
                tensor.data_ptr() == cache.data_ptr()
                and tensor.shape == cache.shape
                and tensor.dtype == cache.dtype
            )
        ):
            raise ValueError(
                f"the canary watches the model's index-K cache only (model.index_cache: "
                f"{tuple(cache.shape)} {cache.dtype}); got a {tuple(tensor.shape)} {tensor.dtype} tensor "
                f"that is not it"
            )
        self.model, self.cache = model, cache
        self.free_sample = free_sample
        self._rng = torch.Generator(device=cache.device).manual_seed(seed)
        self.records: list[dict[str, Any]] = []
        self._scratch = torch.tensor([SCRATCH_PAGE], device=cache.device)
        self._before: torch.Tensor | None = None
        self._ids: torch.Tensor | None = None
        self._step_pages: tuple[Any, torch.Tensor, torch.Tensor] | None = None

    def _pages(self, step: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """step_pages(step), once per replay: before() keeps them for after(), so after() makes no
        host-to-device copy (a blocking one would wait for the replay)."""
        if self._step_pages is None or self._step_pages[0] is not step:
            self._step_pages = (step, *step_pages(step, self.cache.device))
        return self._step_pages[1:]

    def watched(self, step: Mapping[str, Any] | None) -> torch.Tensor | None:
        """The page ids to checksum around this step, ascending, on the cache's device: None (every
        page), or the live, expected and scratch pages plus a fresh sample of free ones."""
        if self.free_sample is None or step is None:
            return None
        live, stores = self._pages(step)
        keep = torch.zeros(self.cache.shape[0], dtype=torch.bool, device=self.cache.device)
        keep[torch.cat([live, stores, self._scratch])] = True
        keep[sample_free(keep, self.free_sample, self._rng)] = True
        return torch.nonzero(keep).flatten()  # a sync: the count sizes the checksum kernel

    def before(self, step: Mapping[str, Any] | None = None) -> None:
        self._step_pages = None  # fresh each replay, even when the same step dict comes back
        if step is not None:
            self._pages(step)  # any host-to-device copy happens here, before the replay
        self._ids = self.watched(step)
        self._before = host_page_checksums(self.cache, self._ids)  # stays on the device

    def after(self, step: Mapping[str, Any]) -> dict[str, Any]:
        """Checksums again; classify the pages that changed since before()."""
        if self._before is None:
            raise RuntimeError("canary.after() without canary.before(): no checksums to compare with")
        ids = self._ids
        if ids is None:
            ids = torch.arange(self.cache.shape[0], device=self.cache.device)
        changed = host_page_checksums(self.cache, self._ids) != self._before
        classes = page_classes(*self._pages(step), self.cache.shape[0])
        self._before = self._ids = self._step_pages = None
        n_changed, n_expected, pages, codes = changed_pages(changed, ids, classes)
        rec = record(step, len(self.records), len(ids), n_changed, n_expected, pages, codes)
        self.records.append(rec)
        return rec

    def summary(self) -> dict[str, int]:
        """The campaign's terms, over every step watched."""
        r = self.records
        return dict(
            steps=len(r),
            pages_watched=sum(x["watched"] for x in r),
            pages_changed=sum(x["changed"] for x in r),
            pages_expected=sum(x["expected"] for x in r),
            expected_unchanged=sum(x["expected_unchanged"] for x in r),
            pages_outside_live=sum(x["outside_live"] for x in r),
            scratch_writes=sum(x["scratch"] for x in r),
            free_page_writes=sum(len(x["free_writes"]) for x in r),
            live_overwrites=sum(len(x["live_overwrites"]) for x in r),
            steps_with_live_overwrite=sum(1 for x in r if x["live_overwrites"]),
        )


def describe(s: Mapping[str, Any]) -> str:
    """One sentence in the campaign's words."""
    return (
        f"{s['pages_changed']} pages changed over {s['steps']} replays when {s['pages_expected']} were "
        f"expected; {s['pages_outside_live']} outside any live range ({s['scratch_writes']} scratch-page "
        f"writes, {s['free_page_writes']} free-page writes); {s['live_overwrites']} live-page overwrites "
        f"({s['pages_watched'] / max(s['steps'], 1):.0f} pages checksummed a replay)"
    )


def watch(
    dev: "Device",
    model: Mapping[str, Any],
    buckets: Sequence[int],
    workload: Mapping[str, Any],
    overlaps: Sequence[str] = ("on", "off"),
    index_dtype: str = "bf16",
    logits_policy: str = "transient",
    progress: Callable[[str], object] | None = print,
) -> list[dict[str, Any]]:
    """The canary over the agentic workload, graph mode, per overlap setting and per bucket (at most
    `bucket` sessions decoding together, as in notebook 00). `model`, `workload`: dicts of config
    values. Returns one row per (overlap, bucket): the sessions' verdicts and the canary's summary.
    The canary adds no node to the graph, so the replays are the uninstrumented ones."""
    rows = []
    for overlap in overlaps:
        m = build.model(dev, model, index_dtype=index_dtype, overlap=overlap, logits_policy=logits_policy)
        runner = Runner(m, buckets, "graph", references=references.shared()).capture()
        for b in sorted(buckets):
            m.index_cache.zero_()
            m.kv_cache.zero_()  # a fresh engine: the last run's entries would
            c = Canary(m)  # make this run's identical stores no-ops
            r, counts = build.bucket_run(runner, workload, b, [c])
            s = c.summary()
            rows.append(
                dict(
                    index_dtype=index_dtype,
                    overlap=overlap,
                    bucket=b,
                    **counts,
                    **{k: v for k, v in s.items() if k != "steps"},
                    replays=s["steps"],
                )
            )
            if progress:
                progress(
                    f"overlap {overlap:3s} bucket {b}: corrupted {r['corrupted_sessions']}/{r['sessions']}; "
                    + describe(s)
                )
        del runner, m
    return rows


def verdict(rows: Sequence[Mapping[str, Any]]) -> str:
    """One sentence from the rows: does the canary find live-page overwrites while sessions are
    corrupted, and does it stay quiet where they are not?"""
    bad = [r for r in rows if r["corrupted_sessions"]]
    clean = [r for r in rows if not r["corrupted_sessions"]]
    tot = lambda rs, k: sum(r[k] for r in rs)
    where = (
        ", ".join(
            f"overlap {r['overlap']} bucket {r['bucket']} ({r['corrupted_sessions']}/{r['sessions']})"
            for r in bad
        )
        or "nowhere"
    )
    if not bad:
        head = "no session was corrupted, so the canary had nothing to explain"
    elif tot(bad, "live_overwrites") == 0:
        head = (
            f"while sessions were corrupted ({where}) the canary found zero live-page overwrites: "
            f"{tot(bad, 'pages_changed')} pages changed when {tot(bad, 'pages_expected')} were expected, "
            f"{tot(bad, 'pages_outside_live')} outside any live range (scratch {tot(bad, 'scratch_writes')}, "
            f"free pages {tot(bad, 'free_page_writes')}): the index-K buffer was pristine, look elsewhere"
        )
    else:
        head = (
            f"while sessions were corrupted ({where}) the canary found {tot(bad, 'live_overwrites')} "
            f"live-page overwrites in {tot(bad, 'steps_with_live_overwrite')} replays: the index-K buffer "
            f"itself is being written"
        )
    quiet = tot(clean, "live_overwrites") + tot(clean, "free_page_writes")
    watched = tot(rows, "pages_watched") / max(tot(rows, "replays"), 1)
    return (
        f"{head}. Clean runs: {quiet} live or free-page alarms over {tot(clean, 'replays')} replays "
        f"({watched:.0f} pages checksummed a replay: live, expected, scratch and {FREE_SAMPLE} sampled free)."
    )
