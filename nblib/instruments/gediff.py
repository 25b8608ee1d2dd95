"""The graph-vs-eager differential: does the captured indexer compute what eager would, on the same
inputs, replay after replay?

While a bucket is captured, the model's indexer hands its inputs (q, head weights, page table,
sequence lengths) and its logits, right before top-k, to this instrument, which stashes them per
bucket. How it stashes is the design (DESIGNS): captured clones or copies into a buffer made before
capture, on the side or the main stream, or references to the graph's own tensors. Clones and copies
are ops like any other, so they are captured: at each replay they copy that replay's values. After
the replay the same kernel is recomputed eagerly from the stashed inputs and compared with the
stashed logits:

  max_abs      largest |graph - eager| over the live rows (-inf equal to -inf; NaN counts as inf)
  argmax       rows whose argmax differs
  topk         rows whose top-k set differs

    gd = GEDiff(model)            # sets model.gediff; capture after this
    runner = Runner(model, buckets).capture()
    run_sessions(runner, w, instruments=[gd])
    gd.table()

Caution, as the campaign learned: a stash is memory and work inside the capture. Clones allocate and
keep graph-pool blocks, references keep the graph's own blocks alive, copies and clones on the side
stream lengthen the side branch; each can move the bug it watches. Notebook 02 measures each design's
rate against no instrument (nblib.studies.designs) before a clean differential is trusted.
"""

from collections.abc import Callable, Mapping
from typing import Any

import torch

from kernels import differential as kdiff
from kernels import indexer as kx
from nblib.core.live import live_ends
from nblib.engine.model import DecodeModel

__all__ = ["DESIGNS", "INPUTS", "GEDiff", "check_design", "metrics"]

INPUTS = ("q", "head_w", "page_table", "seq_lens")

# The ways an engineer writes the stash, each with the same comparison after every replay:
DESIGNS = {
    "campaign": "the campaign's differential as it was run: clones of the inputs and logits captured on "
    "the indexer's (side) stream right after the logits, kept per bucket, recomputed and compared after "
    "every replay: new graph-pool blocks, kept, and extra side-stream work",
    "prealloc": "a stash allocated before capture, outside the graph pool, filled with copy_ on the side "
    "stream: no new pool block, the same extra side-stream work",
    "main_stash": "the inputs cloned on the main stream where they are made, before the fork; only the "
    "logits cloned on the side stream: new pool blocks, less side-stream work",
    "refs": "references to the graph's own tensors, no copy: no extra work, but the logits block stays "
    "allocated after capture, so the allocator cannot hand it on",
}


def check_design(design: str) -> str:
    if design not in DESIGNS:
        raise ValueError(f"unknown differential design {design!r}: choose one of {', '.join(DESIGNS)}")
    return design


class GEDiff:
    """An instrument for run_sessions (before, after) and the model's capture hooks (prepare before
    capture, before_fork on the main stream, __call__ on the logits' stream)."""

    def __init__(
        self, model: DecodeModel, log: Callable[[str], object] | None = None, design: str = "campaign"
    ):
        if model.gediff is not None:
            raise ValueError("this model already has a differential attached")
        self.design = check_design(design)
        self.model = model
        self.stash: dict[int, dict[str, torch.Tensor]] = {}  # bucket -> {q, head_w, ..., logits}
        self.records: list[dict[str, Any]] = []
        self.lines: list[str] = []  # one log line per comparison
        self.log = log
        model.gediff = self  # type: ignore[assignment]  # DecodeModel declares `gediff = None` untyped

    def detach(self) -> None:
        if self.model.gediff is self:
            self.model.gediff = None

    # -- before capture: the prealloc design's stash --------------------------------------------
    def prepare(self, bucket: int) -> None:
        """prealloc: the bucket's stash, allocated now, outside any graph pool (outside capture)."""
        if self.design != "prealloc" or bucket in self.stash:
            return
        cfg, d = self.model.cfg, self.model.dev.torch_device
        self.stash[bucket] = dict(
            q=torch.empty(bucket, cfg.heads, cfg.dim, dtype=torch.bfloat16, device=d),
            head_w=torch.empty(bucket, cfg.heads, dtype=torch.float32, device=d),
            page_table=torch.empty(bucket, cfg.max_ctx // kx.PAGE, dtype=torch.int32, device=d),
            seq_lens=torch.empty(bucket, dtype=torch.int32, device=d),
            logits=torch.empty(bucket, cfg.max_ctx, dtype=torch.float32, device=d),
        )

    # -- inside capture: the model's hooks -------------------------------------------------------
    def _bucket(self):
        b = self.model.bucket
        if b is None:
            raise RuntimeError(
                "the differential's hook ran while capturing without a bucket: "
                "capture through nblib.engine.runner.Runner (it sets model.bucket)"
            )
        return b

    def _clone(self, tensors):
        out = {name: t.clone() for name, t in tensors.items()}
        for name, t in out.items():
            self.model.note(f"gediff.{name}", t)
        return out

    def before_fork(
        self, q: torch.Tensor, head_w: torch.Tensor, page_table: torch.Tensor, seq_lens: torch.Tensor
    ) -> None:
        """On the main stream, before the indexer forks: main_stash clones its inputs here."""
        if self.design == "main_stash":
            inputs = dict(q=q, head_w=head_w, page_table=page_table, seq_lens=seq_lens)
            self.stash[self._bucket()] = self._clone(inputs)

    def __call__(
        self,
        q: torch.Tensor,
        head_w: torch.Tensor,
        page_table: torch.Tensor,
        seq_lens: torch.Tensor,
        logits: torch.Tensor,
    ) -> None:
        """On the logits' stream, right after the logits kernel."""
        b = self._bucket()
        now = dict(q=q, head_w=head_w, page_table=page_table, seq_lens=seq_lens, logits=logits)
        if self.design == "campaign":
            self.stash[b] = self._clone(now)
        elif self.design == "main_stash":
            self.stash[b].update(self._clone(dict(logits=logits)))
        elif self.design == "refs":
            self.stash[b] = now  # the graph's own tensors: kept alive, never copied
        else:  # prealloc
            kept = self.stash[b]
            for name, t in now.items():
                if kept[name].shape != t.shape or kept[name].dtype != t.dtype:
                    raise RuntimeError(
                        f"prealloc stash for bucket {b}: {name} is {tuple(t.shape)} {t.dtype} in the "
                        f"graph, {tuple(kept[name].shape)} {kept[name].dtype} in the stash"
                    )
                kept[name].copy_(t)

    def lookup(self, bucket: int) -> dict[str, torch.Tensor]:
        if bucket not in self.stash:
            raise KeyError(
                f"no differential stash for bucket {bucket!r}: captured buckets are "
                f"{sorted(self.stash) or 'none (capture after attaching GEDiff)'}"
            )
        return self.stash[bucket]

    # -- after a replay --------------------------------------------------------------------------
    def recompute(self, bucket: int) -> torch.Tensor:
        """The same logits kernel, eagerly, on the stashed inputs (outside any graph pool). It
        fills the GPU, which is idle after the replay, where the model's launch keeps to its
        indexer_programs per request to leave SMs to the main branch: the same config and tile
        code, so each token's logit comes out bit for bit the same (tests/test_indexer.py)."""
        s = self.lookup(bucket)
        return self.model.index_logits(*(s[k] for k in INPUTS), programs=0)  # type: ignore[misc]  # INPUTS: 4 positionals

    def compare(self, bucket: int, rows: int | None = None, step: int | None = None) -> dict[str, Any]:
        """Graph logits (stashed) against the eager recompute, over the first `rows` rows."""
        s = self.lookup(bucket)
        eager = self.recompute(bucket)
        graph = s["logits"]
        n = graph.shape[0] if rows is None else rows
        m = metrics(graph[:n], eager[:n], self.model.cfg.topk)
        rec = dict(step=len(self.records) if step is None else step, bucket=bucket, rows=n, **m)
        self.records.append(rec)
        line = (
            f"gediff step {rec['step']} bucket {bucket}: rows {n}, max_abs {m['max_abs']:.3g}, "
            f"argmax differs {m['argmax_rows']}/{n}, top-k set differs {m['topk_rows']}/{n}"
        )
        self.lines.append(line)
        if self.log:
            self.log(line)
        return rec

    def before(self, step: Mapping[str, Any]) -> None:
        pass

    def after(self, step: Mapping[str, Any]) -> dict[str, Any]:
        return self.compare(step["bucket"], step["bs"], step.get("index"))

    def table(self) -> list[dict[str, Any]]:
        """One row per bucket: comparisons, how many diverged, worst max_abs, rows that disagree."""
        out = []
        for b in sorted({r["bucket"] for r in self.records}):
            rs = [r for r in self.records if r["bucket"] == b]
            out.append(
                dict(
                    bucket=b,
                    comparisons=len(rs),
                    diverged=sum(r["diverged"] for r in rs),
                    max_abs=max(r["max_abs"] for r in rs),
                    argmax_rows=sum(r["argmax_rows"] for r in rs),
                    topk_rows=sum(r["topk_rows"] for r in rs),
                    rows=sum(r["rows"] for r in rs),
                )
            )
        return out

    def summary(self) -> dict[str, Any]:
        rs = self.records
        return dict(
            comparisons=len(rs),
            diverged=sum(r["diverged"] for r in rs),
            max_abs=max((r["max_abs"] for r in rs), default=0.0),
            argmax_rows=sum(r["argmax_rows"] for r in rs),
            topk_rows=sum(r["topk_rows"] for r in rs),
        )


def _row_figures(g, e, k):
    """Per row: the largest |g - e| (NaN as inf, equal entries 0, -inf == -inf), whether the
    argmaxes differ, whether the top-k sets differ."""
    same = (g == e) | (torch.isnan(g) & torch.isnan(e))
    inf = torch.tensor(float("inf"))
    diff = (g - e).abs()
    diff = torch.where(same, torch.zeros_like(g), torch.where(torch.isnan(diff), inf, diff))
    row_max = diff.amax(1) if diff.numel() else diff.new_zeros(g.shape[0])
    argmax = g.argmax(1) != e.argmax(1)  # torch's argmax takes NaN as the largest
    kg = kx.topk_indices(g.contiguous(), k).sort(1).values
    ke = kx.topk_indices(e.contiguous(), k).sort(1).values
    return row_max, argmax, (kg != ke).any(1)


def metrics(graph: torch.Tensor, eager: torch.Tensor, k: int) -> dict[str, Any]:
    """max_abs (NaN as inf, -inf == -inf), argmax and top-k set disagreement, counted in rows.
    CUDA: the fused Triton kernel (kernels.differential), one pass over rows that agree; else torch."""
    if graph.is_cuda:
        d = kdiff.differential(graph.float().contiguous(), eager.float().contiguous(), k)
        if not d.max_abs.numel():
            return dict(max_abs=0.0, argmax_rows=0, topk_rows=0, diverged=False)
        # the three figures in one transfer: each .item() would be a sync of its own
        figures = (d.max_abs.max(), d.argmax_differs.sum(), d.topk_differs.sum())
        host = torch.stack([f.double() for f in figures])
        max_abs, argmax_rows, topk_rows = host.tolist()
        argmax_rows, topk_rows = int(argmax_rows), int(topk_rows)
        return dict(
            max_abs=max_abs,
            argmax_rows=argmax_rows,
            topk_rows=topk_rows,
            diverged=bool(max_abs > 0 or argmax_rows or topk_rows),
        )
    g, e = graph.float(), eager.float()
    # past both rows' live columns every entry is -inf in each (equal, never an argmax or a top-k
    # pick that the contract keeps), so each row's figures come out the same from its live prefix
    # alone; rows are independent, so the rows that reach furthest (a lost race's garbage across
    # the whole row) are measured at their width and the others at theirs
    ends = torch.maximum(live_ends(g, k), live_ends(e, k))
    widest = ends == ends.max() if len(ends) else ends.bool()
    parts = []
    for rows in (widest, ~widest):
        if rows.any():
            w = int(ends[rows].max())
            parts.append(_row_figures(g[:, :w][rows], e[:, :w][rows], k))
    row_max, argmax, topk = (torch.cat(p) for p in zip(*parts)) if parts else (torch.zeros(0),) * 3
    max_abs = float(row_max.max()) if row_max.numel() else 0.0
    return dict(
        max_abs=max_abs,
        argmax_rows=int(argmax.sum()),
        topk_rows=int(topk.sum()),
        diverged=bool(max_abs > 0 or argmax.any() or topk.any()),
    )
