"""The instruments' kernels in Triton's interpreter: page checksums (kernels.checksum) against
their reference and the canary's own definition, and the fused differential
(kernels.differential) against its reference and the differential's metrics."""

import pytest
import torch
from interp import interpret, run_without_interpreter

from kernels import badrows as B
from kernels import checksum as C
from kernels import differential as D
from kernels import topk as T
from kernels import topk_keys as K
from nblib.instruments import canary, gediff

# before the fixture swaps in interpreted twins
COMPILED = dict(
    checksum=C._page_checksum_kernel, diff_chunks=D._diff_chunks_kernel, diff_rows=D._diff_rows_kernel
)

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # inf - inf


@pytest.fixture(autouse=True)
def _interpreted(monkeypatch):
    interpret(monkeypatch, B, C, D, T, K)


# ---------------------------------------------------------------- page checksums


def test_checksum_kernel_matches_reference_and_catches_a_swap():
    assert C.check("cpu", pages=40, dim=32, n=24) == dict(pages=24, caches=["bf16", "fp8"])


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_checksums_are_the_canarys(dtype):
    """Over every page, the kernel gives exactly the canary's checksums; on chosen pages, the
    same values at those pages."""
    g = torch.Generator().manual_seed(1)
    if dtype == "bf16":
        cache = torch.randn(30, 64, 32, generator=g).bfloat16()
    else:
        cache = torch.randint(0, 256, (30, 64 * 32 + 256), generator=g, dtype=torch.uint8)
    every = C.page_checksums_(cache, torch.arange(30, dtype=torch.int32), torch.empty(30, dtype=torch.int64))
    assert torch.equal(every, canary.page_checksums(cache))
    ids = torch.tensor([29, 0, 7, 7], dtype=torch.int64)
    assert torch.equal(C.page_checksums_(cache, ids, torch.empty(4, dtype=torch.int64)), every[ids])


def test_checksum_of_one_changed_word_changes():
    cache = torch.zeros(4, 64, 32, dtype=torch.bfloat16)
    ids = torch.arange(4, dtype=torch.int32)
    before = C.page_checksums_(cache, ids, torch.empty(4, dtype=torch.int64)).clone()
    cache[2, 63, 31] = 1.0
    after = C.page_checksums_(cache, ids, torch.empty(4, dtype=torch.int64))
    assert (before != after).tolist() == [False, False, True, False]


def test_checksum_validation_errors():
    cache = torch.zeros(4, 64, 32, dtype=torch.bfloat16)
    ids, out = torch.tensor([0, 1], dtype=torch.int32), torch.empty(2, dtype=torch.int64)
    bad = [
        (lambda: C.page_checksums_(cache.transpose(1, 2), ids, out), "cache must be contiguous"),
        (lambda: C.page_checksums_(torch.zeros(4, 6, dtype=torch.uint8), ids, out), "not whole 32-bit words"),
        (lambda: C.page_checksums_(cache, ids.float(), out), "page_ids must be torch.int32 or torch.int64"),
        (lambda: C.page_checksums_(cache, ids, out[:1]), r"out must have shape \(2,\)"),
        (lambda: C.page_checksums_(cache, ids, out.int()), "out must be torch.int64"),
        (lambda: C.page_checksums_(cache, ids.to("meta"), out), "must be on one device"),
    ]
    for fn, msg in bad:
        with pytest.raises(ValueError, match=msg):
            fn()


def test_checksum_refuses_cpu_tensors_outside_the_interpreter(monkeypatch):
    monkeypatch.setattr(C, "_page_checksum_kernel", COMPILED["checksum"])
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        C.page_checksums_(
            torch.zeros(2, 64, 32), torch.zeros(1, dtype=torch.int32), torch.empty(1, dtype=torch.int64)
        )
    # the dispatcher takes the reference off CUDA
    assert torch.equal(
        C.page_checksums(torch.ones(2, 4), torch.tensor([1])),
        C.ref_page_checksums(torch.ones(2, 4), torch.tensor([1])),
    )


# ---------------------------------------------------------------- differential


def test_differential_matches_reference_on_every_case():
    seen = D.check("cpu")
    assert seen["agree"] == [0.0, 0, 0]
    assert seen["jump"][1:] == [1, 1] and seen["jump"][0] > 1e29
    assert seen["tiny"][1:] == [0, 0] and 0 < seen["tiny"][0] < 1e-2
    assert seen["nan"] == [float("inf"), 1, 1]
    assert seen["kth_swap"][1:] == [0, 1]
    assert seen["ties"][2] == 1
    assert seen["first_max"][1:] == [1, 1]


def test_differential_agrees_with_the_instruments_metrics():
    """Summed over rows, the kernel gives what nblib.instruments.gediff.metrics reports (cases
    without ties at the k-th value, where torch.topk's choice is not specified)."""
    for name, graph, eager in D.cases("cpu"):
        if name == "ties":
            continue
        rows = D.differential(graph, eager, 64)
        m = gediff.metrics(graph, eager, 64)
        assert float(rows.max_abs.max()) == m["max_abs"], name
        assert int(rows.argmax_differs.sum()) == m["argmax_rows"], name
        assert int(rows.topk_differs.sum()) == m["topk_rows"], name


def test_differential_fills_given_outputs_for_strided_rows():
    g = torch.randn(5, 300)[:, :256]
    e = g.clone()
    e[3, 17] += 1.0
    out = D.DiffRows(torch.full((5,), 9.0), torch.ones(5, dtype=torch.bool), torch.ones(5, dtype=torch.bool))
    got = D.differential(g, e, 8, out)
    assert got is out
    assert out.max_abs.tolist() == pytest.approx([0, 0, 0, 1, 0])
    assert [torch.equal(a, b) for a, b in zip(out, D.ref_differential(g, e, 8))] == [True] * 3


@pytest.mark.parametrize("chunk", [1024, 16384])
def test_differential_for_any_number_of_chunks(chunk):
    """Rows of 10000 in 10 chunks (not a power of two: the rows kernel pads them) or in one: the
    reference's figures on every case, the argmax's first occurrence found across chunks."""
    for name, graph, eager in D.cases("cpu"):
        got = D.differential(graph, eager, 64, config=dict(chunk=chunk))
        want = D.ref_differential(graph, eager, 64)
        assert [torch.equal(a, b) for a, b in zip(got, want)] == [True] * 3, name


def test_differential_refuses_cpu_tensors_outside_the_interpreter(monkeypatch):
    monkeypatch.setattr(D, "_diff_chunks_kernel", COMPILED["diff_chunks"])
    monkeypatch.setattr(D, "_diff_rows_kernel", COMPILED["diff_rows"])
    g = torch.randn(2, 100)
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        D.differential(g, g, 5)


def test_differential_validation_errors():
    g = torch.randn(3, 100)
    bad = [
        (lambda: D.differential(g, g[:2], 5), r"eager must have shape \(3, 100\)"),
        (lambda: D.differential(g, g.double(), 5), "eager must be torch.float32"),
        (lambda: D.differential(g, g, 101), "k=101 is larger than the row"),
        (lambda: D.differential(g.t(), g.t(), 1), "contiguous in its last dim"),
        (lambda: D.differential(g, g.to("meta"), 5), "must be on one device"),
        (
            lambda: D.differential(g, g, 5, D.DiffRows(g[:, 0], g[:, 0], g[:, 0])),
            "out.max_abs must be contiguous",
        ),
        (lambda: D.differential(g, g, 5, config=dict(chunk=1000)), "chunk must be a power of two"),
        (lambda: D.differential(g, g, 5, config=dict(warps=4)), r"unknown config keys \['warps'\]"),
    ]
    for fn, msg in bad:
        with pytest.raises(ValueError, match=msg):
            fn()


# ---------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_gpu_check():
    code = "from kernels import checksum as c, differential as d; print(c.check('cuda'), d.check('cuda'))"
    r = run_without_interpreter(["-c", code], timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]


@pytest.mark.gpu
def test_the_differential_and_the_canary_on_cuda_agree_with_their_torch_paths():
    """What gediff and the canary compute on CUDA (the Triton kernels) equals their CPU paths."""
    code = """
import torch
from nblib.instruments import canary, gediff
g = torch.Generator().manual_seed(0)
graph = torch.randn(6, 4000, generator=g)
graph[:, 3000:] = float("-inf")
eager = graph.clone()
eager[1, 7] += 1e-3
eager[4, 10] = float("nan")
for a, b in ((graph, graph.clone()), (graph, eager)):
    assert gediff.metrics(a.cuda(), b.cuda(), 64) == gediff.metrics(a, b, 64), (a is b)
cache = torch.randn(300, 64, 32, generator=g).to(torch.bfloat16)
ids = torch.tensor([0, 5, 299, 17])
assert torch.equal(canary.page_checksums(cache.cuda(), ids).cpu(), canary.page_checksums(cache, ids))
assert torch.equal(canary.page_checksums(cache.cuda()).cpu(), canary.page_checksums(cache))
print("ok")
"""
    r = run_without_interpreter(["-c", code], timeout=600)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout[-2000:] + r.stderr[-4000:]


# ---------------------------------------------------------------- the rows a replay corrupted


def test_bad_rows_kernel_gives_torchs_verdicts():
    """check() raises unless the kernel's flags are torch's, planted rows included (NaN, inf)."""
    res = B.check("cpu", bs=12, width=96, k=24)
    assert res["rows"] == 12 and res["flagged"] >= 3  # the top-k row, the output row, the inf row


@pytest.mark.parametrize("seed", range(4))
def test_bad_rows_kernel_on_random_divergence_and_strided_rows(seed):
    """Random rows with random divergent entries, NaN and inf, the outputs a slice of wider rows
    (the runner's static output): the kernel flags exactly torch's rows, across block edges."""
    g = torch.Generator().manual_seed(seed)
    bs, width, k = 9, 70, 33
    ref = (torch.randn(bs, width + 6, generator=g) * 4).bfloat16()[:, 3 : 3 + width]
    out = ref.clone()
    ref_topk = torch.randint(0, 999, (bs, k), generator=g, dtype=torch.int32)
    topk = ref_topk.clone()
    for _ in range(6):
        r, c = (
            torch.randint(0, bs, (1,), generator=g).item(),
            torch.randint(0, width, (1,), generator=g).item(),
        )
        out[r, c] = [float("nan"), float("inf"), out[r, c].float() * 1.5 + 0.3][c % 3]
    topk[torch.randint(0, bs, (1,), generator=g).item(), k - 1] = -1
    flags = torch.empty(bs, dtype=torch.uint8)
    got = B.bad_rows_(out, ref, topk, ref_topk, flags, 1e-2, config=dict(block_out=32, block_k=16))
    assert torch.equal(got, B.ref_bad_rows(out, ref, topk, ref_topk, 1e-2))
    assert 0 < int(got.sum()) < bs


def test_bad_rows_validation_errors():
    out, topk = torch.zeros(4, 8, dtype=torch.bfloat16), torch.zeros(4, 3, dtype=torch.int32)
    flags = torch.empty(4, dtype=torch.uint8)
    with pytest.raises(ValueError, match="ref_out"):
        B.plan_bad_rows(out, out[:3], topk, topk, flags, 0.01)
    with pytest.raises(ValueError, match="contiguous rows"):
        B.plan_bad_rows(out.t(), out.t(), topk, topk, flags, 0.01)
