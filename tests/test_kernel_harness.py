"""The benchmark harness: what it records about the run (commit, device, versions) and how it
writes tables."""

import contextlib
import json
import shutil
import subprocess
from types import SimpleNamespace

import pytest
import torch
from interp import ROOT, run_without_interpreter

from kernels import harness


def test_nblib_commit_wins(monkeypatch):
    monkeypatch.setenv("NBLIB_COMMIT", "abc123")
    assert harness.meta()["commit"] == "abc123"


def test_a_copy_inside_another_repository_records_unknown(tmp_path):
    """The tree copied into some other git repository (no .git of its own) must not report that
    repository's commit."""
    outer = tmp_path / "outer"
    proj = outer / "copy"
    for pkg in ("kernels", "nblib"):
        shutil.copytree(f"{ROOT}/{pkg}", proj / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    for cmd in (
        ["init", "-q"],
        ["add", "-A"],
        ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"],
    ):
        subprocess.run(["git", *cmd], cwd=outer, check=True, capture_output=True)
    code = (
        f"import sys; sys.path.insert(0, {str(proj)!r}); "
        "from kernels import harness; print(harness.project_commit())"
    )
    r = run_without_interpreter(["-c", code], timeout=120, unset=("NBLIB_COMMIT",))
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "unknown"


def test_this_checkout_records_its_head(monkeypatch):
    monkeypatch.delenv("NBLIB_COMMIT", raising=False)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False)
    if head.returncode != 0:
        pytest.skip("this tree is not a git checkout: no HEAD to compare with")
    assert harness.project_commit().startswith(head.stdout.strip())


def test_write_table_writes_json_and_markdown(tmp_path):
    rows = [dict(name="copy", us=1000.0, frac_copy_bw=1.0), dict(name="k", us=12.5)]
    md = harness.write_table(tmp_path, "bench", dict(commit="c"), rows, ["name", "us", "frac_copy_bw"])
    assert "| k | 12.5 |  |" in md
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved == dict(meta=dict(commit="c"), rows=rows)
    assert (tmp_path / "bench.md").read_text() == md
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.json", "bench.md"]  # no temp files left


def test_bench_table_fills_fractions_of_the_copy_bandwidth(monkeypatch):
    """Each row timed under both flushes, each fraction against the copy under the same flush."""
    from kernels import __main__ as cli

    def slower_if_dirty(us):  # what the fakes "measure": 10 % more after the dirty flush
        return us * (1.1 if harness._FLUSH.get() == "dirty" else 1.0)

    monkeypatch.setattr(
        cli,
        "copy_row",
        lambda: dict(name="copy", us=slower_if_dirty(1000.0), bytes=4_000_000_000, gbps=4000.0),
    )
    for name, mod, us in (
        ("logits", cli.logits_bench, 100.0),  # 2000 GB/s: half the copy's bandwidth
        ("topk", cli.topk, 100.0),
        ("c", cli.checksum, 100.0),
        ("d", cli.differential, 50.0),  # a quarter of the time: twice the copy's bandwidth
        ("b", cli.badrows, 200.0),  # twice the time: half the logits' fraction
    ):
        monkeypatch.setattr(
            mod,
            "benchmark",
            lambda name=name, us=us: [dict(name=name, us=slower_if_dirty(us), bytes=200_000_000)],
        )
    rows = cli.bench_all()
    assert [r["name"] for r in rows] == ["copy", "logits", "topk", "c", "d", "b"]
    assert [r["frac_copy_bw"] for r in rows] == pytest.approx([1.0, 0.5, 0.5, 0.5, 1.0, 0.25])
    assert [r["us_dirty_l2"] for r in rows] == pytest.approx([1100.0, 110.0, 110.0, 110.0, 55.0, 220.0])
    assert [r["frac_copy_bw_dirty_l2"] for r in rows] == pytest.approx([1.0, 0.5, 0.5, 0.5, 1.0, 0.25])
    assert harness._FLUSH.get() == "clean"  # the dirty pass does not leak


def test_flushing_refuses_an_unknown_flush():
    with pytest.raises(ValueError, match="choose one of clean, dirty"), harness.flushing("warm"):
        pass
    with pytest.raises(ValueError, match="choose one of clean, dirty"):
        harness.median_us(lambda: None, flush="warm")


def test_sweep_adopts_only_a_winner_that_is_not_the_default():
    from kernels.logits_bench import adopt_lines
    from kernels.logits_configs import LogitsConfig

    a, b = LogitsConfig(64, 16, 4, 7), LogitsConfig(64, 8, 4, 5, k_load="tma")
    rows = [
        dict(kind="bf16", arch=90, **a._asdict(), default=True, best=True),
        dict(kind="fp8", arch=90, **a._asdict(), default=True),
        dict(kind="fp8", arch=90, **b._asdict(), default=False, best=True),
    ]
    assert adopt_lines(rows) == [f'("fp8", 9): {b!r},']


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the CLI would run")
def test_cli_without_a_gpu_says_so():
    r = run_without_interpreter(["-m", "kernels", "--bench"], timeout=120)
    assert r.returncode == 1 and "needs a CUDA GPU" in r.stderr
    r = run_without_interpreter(["-m", "kernels"], timeout=120)
    assert r.returncode == 2 and "nothing to do" in r.stderr


class FakeGpu:
    """torch as kernels.harness sees it, on a GPU made of a clock (milliseconds): work issued while
    capturing adds its cost to the graph, a replay advances the clock by the graph's cost plus
    noise(replay number), and events read the clock. No wall clock is involved."""

    def __init__(self, flush_ms, readback_ms, noise=lambda i: 0.0):
        self.now, self.capturing, self.replays = 0.0, None, 0
        self.flush_ms, self.readback_ms, self.noise = flush_ms, readback_ms, noise
        gpu = self

        class Tensor:
            def view(self, *shape):
                return self

            def zero_(self):
                gpu.charge(gpu.flush_ms)

        class Graph:
            def __init__(self):
                self.cost = 0.0

            def replay(self):
                gpu.now += self.cost + gpu.noise(gpu.replays)
                gpu.replays += 1

        class Event:
            def __init__(self, enable_timing=False):
                self.t = None

            def record(self):
                self.t = gpu.now

            def synchronize(self):
                pass

            def elapsed_time(self, end):
                return end.t - self.t

        @contextlib.contextmanager
        def graph(g):
            gpu.capturing = g
            try:
                yield
            finally:
                gpu.capturing = None

        self.uint8, self.float32 = torch.uint8, torch.float32
        self.empty = lambda *shape, **kw: Tensor()
        self.sum = lambda rows, dim, out: gpu.charge(gpu.readback_ms)
        self.cuda = SimpleNamespace(
            is_available=lambda: True, synchronize=lambda: None, CUDAGraph=Graph, Event=Event, graph=graph
        )

    def charge(self, ms):
        """Work issued now: into the graph being captured, else run at once."""
        if self.capturing is not None:
            self.capturing.cost += ms
        else:
            self.now += ms


FN_MS = 0.02  # the timed call: 20 us, far below the 256 MB flush it is measured behind


@pytest.mark.parametrize("flush", harness.FLUSHES)
def test_median_us_subtracts_the_flush_and_divides_by_the_calls(monkeypatch, flush):
    """Each pair of replays (calls x (flush, fn), then calls x flush) is differenced, the median of
    the differences divided by the calls: the flush's cost, its read-back under "clean", and a drift
    shared by a pair all cancel; a spike in 2 of 5 pairs is outvoted (a mean would keep 40 % of it)."""
    replays, calls = 5, 10

    def noise(i):  # replay i: two warm-ups, then (with fn, flush alone) per pair
        pair, with_fn = divmod(i - 2, 2)[0], (i - 2) % 2 == 0
        return 0.0 if i < 2 else 0.5 * pair + (3.0 if with_fn and pair in (1, 3) else 0.0)

    gpu = FakeGpu(flush_ms=0.3, readback_ms=0.1, noise=noise)
    monkeypatch.setattr(harness, "torch", gpu)
    ran = []

    def fn():
        ran.append(gpu.capturing is not None)
        gpu.charge(FN_MS)

    us = harness.median_us(fn, calls=calls, replays=replays, flush=flush)
    assert us == pytest.approx(FN_MS * 1e3, rel=1e-9)
    assert ran == [False] + [True] * calls  # one warm-up call outside the capture, then the graph's
    assert gpu.replays == 2 + 2 * replays  # both graphs warmed up once, then the timed pairs


def test_median_us_never_reports_a_negative_time(monkeypatch):
    """A call cheaper than the pairs' noise: the median difference is negative, the figure 0."""
    gpu = FakeGpu(flush_ms=0.3, readback_ms=0.1, noise=lambda i: 0.05 if i >= 2 and i % 2 else 0.0)
    monkeypatch.setattr(harness, "torch", gpu)
    assert harness.median_us(lambda: None, calls=4, replays=3) == 0.0


def test_median_us_falls_back_to_do_bench_when_fn_cannot_be_captured(monkeypatch):
    """A host sync inside fn breaks the capture (RuntimeError): do_bench's median, in microseconds."""
    gpu = FakeGpu(flush_ms=0.3, readback_ms=0.1)
    monkeypatch.setattr(harness, "torch", gpu)
    asked = []

    def do_bench(fn, rep, return_mode):
        asked.append((rep, return_mode))
        return 0.25  # ms

    monkeypatch.setattr(harness.triton.testing, "do_bench", do_bench)

    def syncs():
        if gpu.capturing is not None:
            raise RuntimeError("operation not permitted when stream is capturing")

    assert harness.median_us(syncs, rep_ms=40) == pytest.approx(250.0)
    assert asked == [(40, "median")]
