"""Agentic sessions under continuous batching, every decode step checked against eager.

N sessions x R rounds. A round prefills new context (tool output, user turn), then decodes
`out` tokens; between rounds a session leaves the batch for its tool call: a number of steps, or,
with think_ms_max > 0, a duration on the engine's clock, which each step advances by the time the
step took on the device (CUDA events around the replay and the instruments; on the simulator its
timing model's span of the replay). A slower step (an instrument's work) then brings the tool
calls back after fewer steps, and more sessions decode together, as in the campaign's agents. At
most `concurrency` sessions decode together; each step's batch is padded to its bucket. Every
step is recomputed by the eager single-stream reference on the same inputs: a step diverges
when any row's top-k set or output differs, and a session is corrupted when any of its steps did.
Inputs are teacher-forced (token ids come from the session, not from the model's output), so a
session's inputs never depend on whether an earlier step was corrupted.
"""

import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import torch

from kernels import badrows
from nblib.core import phases
from nblib.engine.model import PAGE, DecodeModel
from nblib.engine.runner import SCRATCH_SLOT, Runner, bucket_for

if TYPE_CHECKING:
    from nblib.backends.device import Device

__all__ = [
    "ALIGN", "CTX_DISTS", "Batch", "Instrument", "NoClock", "PagePool", "Replayed", "Scheduler", "Session",
    "StepClock", "WorkloadConfig", "bad_rows", "build_batch", "in_bucket", "inputs_to_device", "pack",
    "replay_step", "run_sessions", "to_device", "unpack", "verdicts",
]  # fmt: skip

CTX_DISTS = ("uniform", "loguniform")


@dataclass(frozen=True)
class WorkloadConfig:
    sessions: int = 40
    rounds: int = 3
    concurrency: int = 8
    ctx_min: int = 1024  # compressed entries in the first prompt
    ctx_max: int = 32768
    ctx_dist: str = "uniform"  # first prompt's entries: uniform | loguniform (many short, few long)
    turn_ctx: int = 2048  # compressed entries each later round adds (tool output, user turn)
    out_min: int = 16  # tokens decoded per round
    out_max: int = 128
    think_min: int = 1  # steps a session sits out between rounds
    think_max: int = 8
    think_ms_min: float = 0.0  # with think_ms_max > 0: a tool call lasts this long (ms) on the engine's clock
    think_ms_max: float = 0.0  # 0: tool calls last think_min..think_max steps
    out_tol: float = 1e-2  # output divergence threshold, relative to the reference's max |x|
    seed: int = 0

    def __post_init__(self):
        if self.ctx_dist not in CTX_DISTS:
            raise ValueError(f"unknown ctx_dist {self.ctx_dist!r}: choose one of {', '.join(CTX_DISTS)}")
        if not 0 <= self.think_ms_min <= self.think_ms_max:
            raise ValueError(
                f"think_ms_min {self.think_ms_min} and think_ms_max {self.think_ms_max}: "
                "need 0 <= think_ms_min <= think_ms_max (think_ms_max 0: tool calls counted in steps)"
            )

    @property
    def timed(self) -> bool:
        """Tool calls last a duration on the engine's clock, not a number of steps."""
        return self.think_ms_max > 0


class Instrument(Protocol):
    """What run_sessions calls right before and right after each replay, with the step's dict
    (run_sessions says what it holds); what they return is the instrument's own (run_sessions
    ignores it)."""

    def before(self, step: dict[str, Any]) -> object: ...

    def after(self, step: dict[str, Any]) -> object: ...


class Session:
    # set by the Scheduler: the tool call's steps left (wait), its end on the engine's clock
    # (back_at), and each round's tool-call duration in seconds when the workload is timed (think_s)
    wait: int
    back_at: float
    think_s: list[float]

    def __init__(self, sid: int, rng: torch.Generator, w: WorkloadConfig):
        self.sid, self.round, self.c4_len, self.pos = sid, 0, 0, 0
        self.pages: list[int] = []
        if w.ctx_dist == "loguniform":
            u = float(torch.rand(1, generator=rng))
            self.first_ctx = int(
                math.exp(math.log(w.ctx_min) + u * (math.log(w.ctx_max) - math.log(w.ctx_min)))
            )
        else:
            self.first_ctx = int(torch.randint(w.ctx_min, w.ctx_max + 1, (1,), generator=rng))
        self.outs = torch.randint(w.out_min, w.out_max + 1, (w.rounds,), generator=rng).tolist()
        self.thinks = torch.randint(w.think_min, w.think_max + 1, (w.rounds,), generator=rng).tolist()
        self.left = 0

    def slot(self, t: int) -> int:
        return self.pages[t // PAGE] * PAGE + t % PAGE

    def slots(self, start: int, stop: int) -> torch.Tensor:
        t = torch.arange(start, stop)
        return torch.tensor(self.pages, dtype=torch.long)[t // PAGE] * PAGE + t % PAGE


class PagePool:
    def __init__(self, num_pages: int):
        self.free = deque(range(1, num_pages))  # page 0 is scratch

    def take(self, n: int) -> list[int]:
        if n > len(self.free):
            raise RuntimeError(
                f"out of cache pages: need {n}, {len(self.free)} free; "
                "raise num_pages or lower concurrency/contexts"
            )
        return [self.free.popleft() for _ in range(n)]

    def give(self, pages: Iterable[int]) -> None:
        self.free.extend(pages)


def _grow(model, pool, tables, s, n, gen):
    """Prefill n new compressed entries for session s (random keys: prefill is not studied)."""
    cap = model.cfg.max_ctx - 1 - s.left // 4  # leave room for this round's decode
    n = max(0, min(n, cap - s.c4_len))
    _take_pages(pool, tables, s, -(-(s.c4_len + n) // PAGE) - len(s.pages))
    if n:
        model.prefill_entries(to_device(s.slots(s.c4_len, s.c4_len + n), model.dev.torch_device), gen)
    s.c4_len += n


def _take_pages(pool, tables, s, n):
    if n > 0:
        new = pool.take(n)
        tables[s.sid, len(s.pages) : len(s.pages) + n] = torch.tensor(new, dtype=torch.int32)
        s.pages += new


def _live_pages(*groups):
    """Pages held by unfinished sessions: every one holds entries (or this step's new entry)."""
    return {p for g in groups for s in g for p in s.pages}


class Scheduler:
    """Which sessions decode each step: continuous batching over waiting, active and thinking
    sessions, with the cache pages (pool and host page tables) they hold.

    next_batch() brings back the tool calls that came back, admits waiting sessions up to
    `concurrency` (prefilling each round's new context), and returns the batch (empty while every
    unfinished session is thinking); retire(batch, seconds) moves the sessions whose round ended out
    of it. now: the engine's clock (seconds), which retire advances by each step's time; a timed
    tool call comes back at the first step boundary at or after its end, and when every unfinished
    session is out on one, the engine idles until the first comes back."""

    active: list[Session]
    thinking: list[Session]

    def __init__(self, model: DecodeModel, max_pages: int, w: WorkloadConfig, gen: torch.Generator):
        self.model, self.w, self.gen = model, w, gen
        self.pool = PagePool(model.cfg.num_pages)
        self.tables = torch.zeros(w.sessions, max_pages, dtype=torch.int32)  # host page tables
        rng = torch.Generator().manual_seed(w.seed)
        self.waiting = deque(Session(i, rng, w) for i in range(w.sessions))
        if w.timed:  # drawn after every other draw, so those are the step-counted workload's
            for x in self.waiting:
                u = torch.rand(w.rounds, generator=rng, dtype=torch.float64)
                x.think_s = ((w.think_ms_min + u * (w.think_ms_max - w.think_ms_min)) / 1e3).tolist()
        self.active, self.thinking = [], []
        self.now = 0.0

    def busy(self) -> bool:
        return bool(self.waiting or self.active or self.thinking)

    def next_batch(self) -> list[Session]:
        self._calls_back()
        if self.w.timed and self.thinking and not (self.active or self.waiting):
            self.now = min(s.back_at for s in self.thinking)  # idle until the first call returns
            self._calls_back()
        while self.waiting and len(self.active) < self.w.concurrency:
            s = self.waiting.popleft()
            s.left = s.outs[s.round]
            n = s.first_ctx if s.round == 0 else self.w.turn_ctx
            _grow(self.model, self.pool, self.tables, s, n, self.gen)
            self.active.append(s)
        return self.active[: self.w.concurrency]

    def _calls_back(self):
        """Tool calls that came back rejoin the queue, ahead of sessions not yet started."""
        for s in list(self.thinking):
            if self.w.timed:
                back = s.back_at <= self.now
            else:
                s.wait -= 1
                back = s.wait <= 0
            if back:
                self.thinking.remove(s)
                self.waiting.appendleft(s)

    def live_pages(self) -> set[int]:
        return _live_pages(self.waiting, self.active, self.thinking)

    def retire(self, batch: Iterable[Session], seconds: float = 0.0) -> None:
        """One token decoded for each session of `batch`, in a step that took `seconds` on the
        engine's clock: a session whose round ended thinks (a tool call) or, after its last round,
        gives its pages back."""
        self.now += seconds
        for s in batch:
            s.left -= 1
            if s.left == 0:
                self.active.remove(s)
                s.round += 1
                if s.round == self.w.rounds:
                    self.pool.give(s.pages)
                    self.tables[s.sid].zero_()
                    s.pages = []
                else:
                    s.wait = s.thinks[s.round]
                    s.back_at = self.now + (s.think_s[s.round] if self.w.timed else 0.0)
                    self.thinking.append(s)


class Batch(NamedTuple):
    """One step's inputs, built on the host: the references' digest reads these host copies (no sync)."""

    sessions: list[int]  # session ids, one per row
    lens: list[int]  # compressed entries per row (at least 1): the indexer's work
    host: tuple[torch.Tensor, ...]  # (tokens, page_table, seq_lens, store_slots), CPU tensors


def build_batch(model: DecodeModel, pool: PagePool, tables: torch.Tensor, batch: Sequence[Session]) -> Batch:
    """Advance each session of `batch` one token and build the step's inputs. Every 4th token the
    4:1 compressor stores one entry (taking a page when the last one is full); other tokens store
    to the scratch slot. Token ids are teacher-forced: a function of the session and position."""
    tokens, lens, stores = [], [], []
    for s in batch:
        s.pos += 1
        store = SCRATCH_SLOT
        if s.pos % 4 == 0 and s.c4_len < model.cfg.max_ctx:  # the 4:1 compressor emits one entry
            _take_pages(pool, tables, s, s.c4_len // PAGE + 1 - len(s.pages))
            store = s.slot(s.c4_len)
            s.c4_len += 1
        tokens.append((s.sid * 7919 + s.pos * 104729) % model.cfg.vocab)
        lens.append(max(1, s.c4_len))
        stores.append(store)
    sids = [s.sid for s in batch]
    host = (
        torch.tensor(tokens),
        tables[torch.tensor(sids)],
        torch.tensor(lens, dtype=torch.int32),
        torch.tensor(stores),
    )
    return Batch(sids, lens, host)


class StepClock:
    """The device time of one engine step: events recorded around the replay and its instruments,
    read when the step ends. On CUDA the host then waits for the step, as an engine that samples
    every step does; on the simulator an event reads its stream's clock: the timing model's span of
    the replays in between and, under dev.eager_timing(), of the eager kernels."""

    def __init__(self, dev: "Device"):
        self.dev, self.seconds = dev, 0.0

    def __enter__(self) -> "StepClock":
        self.timing = self.dev.eager_timing()
        self.timing.__enter__()
        self.start = self.dev.Event(enable_timing=True)
        self.start.record()
        return self

    def __exit__(self, *exc: object) -> None:
        end = self.dev.Event(enable_timing=True)
        end.record()
        self.timing.__exit__(*exc)
        end.synchronize()
        self.seconds = self.start.elapsed_time(end) / 1e3


class NoClock:
    """A step-counted workload's clock: reads nothing, costs nothing."""

    seconds = 0.0

    def __enter__(self) -> "NoClock":
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class Replayed(NamedTuple):
    """One step's replay and its eager reference."""

    out: torch.Tensor
    topk: torch.Tensor
    bucket: int
    ref_out: torch.Tensor
    ref_topk: torch.Tensor


def replay_step(
    runner: Runner,
    w: WorkloadConfig,
    index: int,
    args: Sequence[torch.Tensor],
    host: Sequence[torch.Tensor],
    instruments: Sequence[Instrument] = (),
    live_pages: Callable[[], set[int]] = set,
    clock: StepClock | NoClock | None = None,
) -> Replayed:
    """Replay one step (runner.run) and compute its eager reference. With instruments, each one's
    before(step) and after(step) wrap the replay, and the replay comes first (so an instrument sees
    the replay's own cache writes); without, the reference comes first. live_pages: a callable,
    called only when there are instruments (the step dict's live_pages). clock: times the replay
    and the instruments (StepClock), never the reference, which is the checker's work, not the
    engine's."""
    clock = clock or NoClock()
    if not instruments:
        ref_out, ref_topk = _reference(runner, w, index, args, host)
        with phases.phase("replays"), clock:
            out, topk, bucket = runner.run(*args)
        return Replayed(out, topk, bucket, ref_out, ref_topk)
    step = dict(
        index=index,
        bs=len(args[0]),
        bucket=bucket_for(len(args[0]), runner.buckets),
        tokens=args[0],
        page_table=args[1],
        seq_lens=args[2],
        store_slots=args[3],
        live_pages=live_pages(),
    )
    with clock:
        with phases.phase("instruments"):
            for ins in instruments:
                ins.before(step)
        with phases.phase("replays"):
            out, topk, bucket = runner.run(*args)
        with phases.phase("instruments"):
            for ins in instruments:
                ins.after(step)
    ref_out, ref_topk = _reference(runner, w, index, args, host)
    return Replayed(out, topk, bucket, ref_out, ref_topk)


def bad_rows(r: Replayed, out_tol: float) -> torch.Tensor:
    """Per row, 1 where the replay diverged from its reference: the top-k set differs, or the
    output differs by more than out_tol times the reference's max |x| (at least 1). A device
    tensor: read once, at the end of the run."""
    return badrows.bad_rows(r.out, r.ref_out, r.topk, r.ref_topk, out_tol)  # one launch on CUDA


def verdicts(sessions: int, steps: list[dict[str, Any]], pending: Sequence[torch.Tensor]) -> dict[str, Any]:
    """The run's verdicts from each step's row flags (pending: one host or device uint8 tensor
    per step, in order): fills each step's rows and bad_rows; a session is corrupted when any of
    its rows was."""
    flags = torch.cat([p.cpu() for p in pending]).tolist() if pending else []
    corrupted: set[int] = set()
    i = 0
    for st in steps:
        rows = flags[i : i + st["bs"]]
        i += st["bs"]
        st["bad_rows"], st["rows"] = int(sum(rows)), rows
        corrupted.update(sid for sid, f in zip(st["sessions"], rows) if f)
    return dict(
        sessions=sessions,
        corrupted_sessions=len(corrupted),
        steps=len(steps),
        corrupted_steps=sum(1 for st in steps if st["bad_rows"]),
        corrupted_ids=sorted(corrupted),
        step_log=steps,
    )


def run_sessions(runner: Runner, w: WorkloadConfig, instruments: Sequence[Instrument] = ()) -> dict[str, Any]:
    """Run the workload through `runner`; returns per-step and per-session verdicts.

    instruments: objects with before(step) and after(step), called right before and right after
    each runner.run (the replay), where step is a dict: index, bs, bucket, the step's inputs
    (tokens, page_table, seq_lens, store_slots) and live_pages (the cache pages every unfinished
    session holds, scratch page 0 excluded). With instruments, each step replays before its eager
    reference (so an instrument sees the replay's own cache writes, as in an engine that has no
    reference); the order does not change what either computes."""
    model, dev = runner.model, runner.dev
    if w.concurrency > max(runner.buckets):
        raise ValueError(f"concurrency {w.concurrency} exceeds the largest bucket {max(runner.buckets)}")
    d = dev.torch_device
    gen = torch.Generator(device=d).manual_seed(w.seed + 1)
    sched = Scheduler(model, runner.max_pages, w, gen)
    pending: list[torch.Tensor] = []  # GPU verdicts are read once, at the end
    steps: list[dict[str, Any]] = []
    clock: StepClock | NoClock = StepClock(dev) if w.timed else NoClock()
    while sched.busy():
        batch = sched.next_batch()
        if not batch:
            continue
        b = build_batch(model, sched.pool, sched.tables, batch)
        args = inputs_to_device(b.host, d)
        r = replay_step(runner, w, len(steps), args, b.host, instruments, sched.live_pages, clock)
        pending.append(bad_rows(r, w.out_tol))
        # the step's contexts: the indexer's work, so the side branch's length (the race's window)
        st = dict(
            bs=len(batch), bucket=r.bucket, sessions=b.sessions, ctx_sum=sum(b.lens), ctx_max=max(b.lens)
        )
        if w.timed:
            st["seconds"] = clock.seconds  # the step's device time, which moved the engine's clock
        steps.append(st)
        sched.retire(batch, clock.seconds)
    with phases.phase("replays"):  # the queued replays and references drain here
        dev.synchronize()
    references = getattr(runner, "references", None)
    if references is not None:
        with phases.phase("eager references"):
            references.flush()  # the run folder's other notebooks read them (References.attach)
    return verdicts(w.sessions, steps, pending)


def to_device(x: torch.Tensor, d: torch.device | str) -> torch.Tensor:
    """A step's host input on device d without holding the host. A blocking copy synchronizes the
    stream (the host would wait for every queued replay, once a step), and so may an asynchronous
    one from pageable memory; from pinned memory it is queued, and PyTorch's caching host allocator
    keeps the pinned block from reuse until the copy has run. The CPU (the simulator) takes x."""
    if torch.device(d).type != "cuda":
        return x.to(d)
    return x.pin_memory().to(d, non_blocking=True)


ALIGN = 16  # bytes: a kernel given a view of the packed inputs sees the alignment Triton specialises on


def inputs_to_device(host: Sequence[torch.Tensor], d: torch.device | str) -> tuple[torch.Tensor, ...]:
    """A step's host inputs on device d in one copy: packed into one pinned buffer (pack), copied
    without waiting (to_device's reason), and returned as views of the device copy with their own
    dtypes and shapes (unpack). One pinned staging and one copy a step instead of one per input: the
    host's work between replays is what bounds the eager rows. The CPU (the simulator) takes each."""
    if torch.device(d).type != "cuda":
        return tuple(to_device(x, d) for x in host)
    staged, offsets = pack(host, pin=True)
    # the caching host allocator keeps `staged` from reuse until the copy has run
    return unpack(staged.to(d, non_blocking=True), host, offsets)


def pack(host: Sequence[torch.Tensor], pin: bool = False) -> tuple[torch.Tensor, list[int]]:
    """(uint8 buffer, byte offsets): each tensor of `host` at an offset that is a multiple of ALIGN."""
    flat = [x.contiguous().reshape(-1).view(torch.uint8) for x in host]
    offsets, end = [], 0
    for f in flat:
        offsets.append(end)
        end += -(-f.numel() // ALIGN) * ALIGN
    staged = torch.empty(end, dtype=torch.uint8, pin_memory=pin)
    for f, o in zip(flat, offsets):
        staged[o : o + f.numel()].copy_(f)
    return staged, offsets


def unpack(
    buf: torch.Tensor, host: Sequence[torch.Tensor], offsets: Sequence[int]
) -> tuple[torch.Tensor, ...]:
    """Views of `buf` (pack's buffer, or a copy of it) shaped and typed as the tensors of `host`."""
    return tuple(
        buf[o : o + x.numel() * x.element_size()].view(x.dtype).view(x.shape) for x, o in zip(host, offsets)
    )


def _reference(runner, w, index, args, host):
    """The step's eager reference: from the runner's References when it has one."""
    with phases.phase("eager references"):
        if getattr(runner, "references", None) is None:
            return runner.reference(*args)
        return runner.references.get(runner, w, index, args, host)


def in_bucket(result: dict[str, Any], bucket: int) -> dict[str, int]:
    """The verdicts of the steps replayed in `bucket`'s graph only. A run with at most b sessions
    decoding together also replays smaller buckets when fewer sessions are active (its tail); a
    corrupted tail step says nothing about bucket b's graph, so per-bucket rows count only these.
    sessions: the sessions with at least one step in this bucket; tail_*: the other steps."""
    mine = [st for st in result["step_log"] if st["bucket"] == bucket]
    tail = [st for st in result["step_log"] if st["bucket"] != bucket]
    bad = {sid for st in mine for sid, f in zip(st["sessions"], st.get("rows", [])) if f}
    return dict(
        sessions=len({sid for st in mine for sid in st["sessions"]}),
        corrupted_sessions=len(bad),
        steps=len(mine),
        corrupted_steps=sum(1 for st in mine if st["bad_rows"]),
        tail_steps=len(tail),
        tail_corrupted_steps=sum(1 for st in tail if st["bad_rows"]),
    )
