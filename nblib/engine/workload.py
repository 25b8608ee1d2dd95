"""Agentic sessions under continuous batching, every decode step checked against eager.

N sessions x R rounds. A round prefills new context (tool output, user turn), then decodes
`out` tokens; between rounds a session leaves the batch for a few steps (the tool call). At
most `concurrency` sessions decode together; each step's batch is padded to its bucket. Every
step is recomputed by the eager single-stream reference on the same inputs: a step diverges
when any row's top-k set or output differs, and a session is corrupted when any of its steps did.
Inputs are teacher-forced (token ids come from the session, not from the model's output), so a
session's inputs never depend on whether an earlier step was corrupted.
"""

import math
from collections import deque
from dataclasses import dataclass

import torch

from nblib.core import phases
from nblib.engine.model import PAGE
from nblib.engine.runner import SCRATCH_SLOT, bucket_for

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
    out_tol: float = 1e-2  # output divergence threshold, relative to the reference's max |x|
    seed: int = 0

    def __post_init__(self):
        if self.ctx_dist not in CTX_DISTS:
            raise ValueError(f"unknown ctx_dist {self.ctx_dist!r}: choose one of {', '.join(CTX_DISTS)}")


class Session:
    def __init__(self, sid, rng, w):
        self.sid, self.round, self.c4_len, self.pos = sid, 0, 0, 0
        self.pages, self.corrupted = [], False
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

    def slot(self, t):
        return self.pages[t // PAGE] * PAGE + t % PAGE

    def slots(self, start, stop):
        t = torch.arange(start, stop)
        return torch.tensor(self.pages, dtype=torch.long)[t // PAGE] * PAGE + t % PAGE


class PagePool:
    def __init__(self, num_pages):
        self.free = deque(range(1, num_pages))  # page 0 is scratch

    def take(self, n):
        if n > len(self.free):
            raise RuntimeError(
                f"out of cache pages: need {n}, {len(self.free)} free; "
                "raise num_pages or lower concurrency/contexts"
            )
        return [self.free.popleft() for _ in range(n)]

    def give(self, pages):
        self.free.extend(pages)


def _grow(model, pool, tables, s, n, gen):
    """Prefill n new compressed entries for session s (random keys: prefill is not studied)."""
    cap = model.cfg.max_ctx - 1 - s.left // 4  # leave room for this round's decode
    n = max(0, min(n, cap - s.c4_len))
    _take_pages(pool, tables, s, -(-(s.c4_len + n) // PAGE) - len(s.pages))
    if n:
        model.prefill_entries(s.slots(s.c4_len, s.c4_len + n).to(model.dev.torch_device), gen)
    s.c4_len += n


def _take_pages(pool, tables, s, n):
    if n > 0:
        new = pool.take(n)
        tables[s.sid, len(s.pages) : len(s.pages) + n] = torch.tensor(new, dtype=torch.int32)
        s.pages += new


def _live_pages(*groups):
    """Pages held by unfinished sessions: every one holds entries (or this step's new entry)."""
    return {p for g in groups for s in g for p in s.pages}


def run_sessions(runner, w: WorkloadConfig, instruments=()):
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
    rng = torch.Generator().manual_seed(w.seed)
    gen = torch.Generator(device=d).manual_seed(w.seed + 1)
    pool = PagePool(model.cfg.num_pages)
    tables = torch.zeros(w.sessions, runner.max_pages, dtype=torch.int32)  # host page tables
    waiting = deque(Session(i, rng, w) for i in range(w.sessions))
    active, thinking, finished = [], [], []
    pending, steps = [], []  # GPU verdicts are read once, at the end
    while waiting or active or thinking:
        for s in list(thinking):  # tool calls that came back
            s.wait -= 1
            if s.wait <= 0:
                thinking.remove(s)
                waiting.appendleft(s)
        while waiting and len(active) < w.concurrency:
            s = waiting.popleft()
            s.left = s.outs[s.round]
            _grow(model, pool, tables, s, s.first_ctx if s.round == 0 else w.turn_ctx, gen)
            active.append(s)
        if not active:
            continue
        batch = active[: w.concurrency]
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
        sids = torch.tensor([s.sid for s in batch])
        # built on the host, then moved: the references' digest reads the host copies (no sync)
        host = (
            torch.tensor(tokens),
            tables[sids],
            torch.tensor(lens, dtype=torch.int32),
            torch.tensor(stores),
        )
        args = tuple(x.to(d) for x in host)
        if instruments:
            step = dict(
                index=len(steps),
                bs=len(batch),
                bucket=bucket_for(len(batch), runner.buckets),
                tokens=args[0],
                page_table=args[1],
                seq_lens=args[2],
                store_slots=args[3],
                live_pages=_live_pages(waiting, active, thinking),
            )
            with phases.phase("instruments"):
                for ins in instruments:
                    ins.before(step)
            with phases.phase("replays"):
                out, topk, bucket = runner.run(*args)
            with phases.phase("instruments"):
                for ins in instruments:
                    ins.after(step)
            ref_out, ref_topk = _reference(runner, w, len(steps), args, host)
        else:
            ref_out, ref_topk = _reference(runner, w, len(steps), args, host)
            with phases.phase("replays"):
                out, topk, bucket = runner.run(*args)
        bad = (topk != ref_topk).any(1)
        scale = ref_out.float().abs().amax(1).clamp(min=1.0)
        bad |= (out.float() - ref_out.float()).abs().amax(1) > w.out_tol * scale
        pending.append(bad.to(torch.uint8))
        # the step's contexts: the indexer's work, so the side branch's length (the race's window)
        steps.append(
            dict(
                bs=len(batch),
                bucket=bucket,
                sessions=[s.sid for s in batch],
                ctx_sum=sum(lens),
                ctx_max=max(lens),
            )
        )
        for s in batch:
            s.left -= 1
            if s.left == 0:
                active.remove(s)
                s.round += 1
                if s.round == w.rounds:
                    pool.give(s.pages)
                    tables[s.sid].zero_()
                    s.pages = []
                    finished.append(s)
                else:
                    s.wait = s.thinks[s.round]
                    thinking.append(s)
    dev.synchronize()
    flags = torch.cat([p.cpu() for p in pending]).tolist() if pending else []
    corrupted = set()
    i = 0
    for st in steps:
        rows = flags[i : i + st["bs"]]
        i += st["bs"]
        st["bad_rows"], st["rows"] = int(sum(rows)), rows
        corrupted.update(sid for sid, f in zip(st["sessions"], rows) if f)
    return dict(
        sessions=w.sessions,
        corrupted_sessions=len(corrupted),
        steps=len(steps),
        corrupted_steps=sum(1 for st in steps if st["bad_rows"]),
        corrupted_ids=sorted(corrupted),
        step_log=steps,
    )


def _reference(runner, w, index, args, host):
    """The step's eager reference: from the runner's References when it has one."""
    with phases.phase("eager references"):
        if getattr(runner, "references", None) is None:
            return runner.reference(*args)
        return runner.references.get(runner, w, index, args, host)


def in_bucket(result, bucket):
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
