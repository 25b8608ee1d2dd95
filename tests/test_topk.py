"""The Triton top-k kernels (kernels.topk's "bound" pair and kernels.topk_fused) against torch on
random, tied, all -inf, short and long rows, in Triton's interpreter on the CPU; the references; the
argument checks; the custom op."""

import pytest
import torch
from interp import interpret, run_without_interpreter
from plain_refs import topk_contract

from kernels import indexer as kx
from kernels import topk as T
from kernels import topk_check as TC
from kernels import topk_fused as F
from kernels import topk_keys as K
from kernels import topk_row_bound as RB
from kernels.launch import run

# before the fixture swaps in interpreted twins
COMPILED = (K.row_maxima_kernel, T._topk_kernel, RB.row_bound_kernel, F._fused_kernel)
# fused: chunks of 1024 entries, so a row of 4096 spans 4 candidate lists
KERNEL_CONFIGS = dict(bound=None, fused=dict(chunk=1024))
NEG_INF = float("-inf")


@pytest.fixture(autouse=True)
def _interpreted(monkeypatch):
    interpret(monkeypatch, T, K, F, RB)


# ---------------------------------------------------------------- references


def test_order_keys_follow_float_order_with_nan_on_top():
    x = torch.tensor([NEG_INF, -3e38, -1.0, -1e-45, -0.0, 0.0, 1e-45, 1.0, 3e38, float("inf"), float("nan")])
    keys = T.order_keys(x[None])[0]
    assert keys.tolist() == sorted(keys.tolist())  # ascending floats -> ascending keys
    assert keys[4] == keys[5]  # -0.0 == +0.0
    assert len(set(keys.tolist())) == len(x) - 1
    assert int(keys.min()) > 0 and int(keys.max()) == 2**32 - 1


def test_ref_equals_torch_topk_without_ties():
    x = torch.randn(4, 3000)
    x[1, ::3] = NEG_INF
    x[2] = NEG_INF
    x[2, [5, 9]] = 1.0
    assert torch.equal(T.ref_topk_indices(x, 100), topk_contract(x, 100))
    assert T.ref_topk_indices(x, 100)[2].tolist() == [5, 9] + [-1] * 98


def test_ties_at_the_kth_value_go_to_the_lowest_index():
    x = torch.tensor([[1.0, 5.0, 3.0, 3.0, 3.0, 0.0, 3.0]])
    # the k-th (3rd) value is 3.0, held by entries 2, 3, 4, 6: the lowest (2, 3) are taken
    assert T.ref_topk_indices(x, 3).tolist() == [[1, 2, 3]]
    assert T.topk_indices_triton(x, 3).tolist() == [[1, 2, 3]]


def test_lengths_mask_past_the_end():
    x = torch.arange(10.0).repeat(2, 1)
    lens = torch.tensor([4, 0], dtype=torch.int32)
    assert T.ref_topk_indices(x, 3, lens).tolist() == [[1, 2, 3], [-1, -1, -1]]
    assert T.topk_indices(x, 3, lens).tolist() == [[1, 2, 3], [-1, -1, -1]]


# ---------------------------------------------------------------- kernel (interpreter)


@pytest.mark.parametrize("kernel", T.KERNELS)
@pytest.mark.parametrize("name", [c[0] for c in TC.cases("cpu", width=256, k=16, bs=1)])
def test_kernel_matches_reference_and_torch(name, kernel):
    # width 4096, k 64: the sub-chunk bound is in force (256 maxima >= k); short_row: it is not
    assert K.sub_chunks(4096, 64, T.TOPK_CONFIG["maxima"]) == (16, 256)
    x, lens = next((x, lens) for n, x, lens in TC.cases("cpu", width=4096, k=64, bs=3) if n == name)
    assert TC.check_rows(x, 64, lens, kernel=kernel, config=KERNEL_CONFIGS[kernel]) == 3


@pytest.mark.parametrize("kernel", T.KERNELS)
def test_kernel_at_the_models_shape(kernel):
    """k 512 over 65536 logits, random and tied rows (two rows each: the interpreter is slow). On
    tied rows the fused select has 16384 candidates, more than its registers hold (cap 1024)."""
    for name, x, lens in TC.cases("cpu", width=65536, k=512, bs=2)[:2]:
        assert TC.check_rows(x, 512, lens, kernel=kernel) == 2, name


@pytest.mark.parametrize("kernel", T.KERNELS)
def test_kernel_without_the_bound_falls_back_to_every_entry(kernel):
    x = torch.randn(2, 300)
    sub, num_max = K.sub_chunks(300, 256, T.TOPK_CONFIG["maxima"])
    assert num_max < 256  # fewer sub-chunks than k: the bound is 0, every entry a candidate
    assert TC.check_rows(x, 256, kernel=kernel) == 2


def test_minus_inf_entries_are_never_candidates():
    """A graph's padded rows are all -inf, and a short row is mostly -inf: they write no
    candidate (else every entry of such a row would be one, the slowest case), and still come out
    as the contract says: the finite entries in index order, then -1s."""
    x = torch.randn(3, 4096)
    x[1] = NEG_INF  # a padded row
    x[2, 40:] = NEG_INF  # fewer finite entries than k
    maxima, select = T.plan_topk(x, 64)
    cand, ckey = select.args["cand_ptr"], select.args["ckey_ptr"]
    cand.fill_(-7), ckey.fill_(-7)
    run(maxima), run(select)
    assert (cand[1] == -7).all() and (ckey[1] == -7).all()
    assert (cand[2, 40:] == -7).all() and cand[2, :40].tolist() == list(range(40))
    out = select.args["out_ptr"]
    assert torch.equal(out, T.ref_topk_indices(x, 64))
    assert out[1].tolist() == [-1] * 64 and out[2].tolist() == list(range(40)) + [-1] * 24


def test_minus_inf_entries_are_never_filter_candidates():
    """The same for the fused kernel: no chunk of the padded row lists a candidate,
    the short row's first chunk lists exactly its 40 finite entries, in index order, and the -1s
    follow them."""
    x = torch.randn(3, 4096)
    x[1] = NEG_INF
    x[2, 40:] = NEG_INF
    launches = F.plan_topk_fused(x, 64, config=dict(chunk=1024))
    for launch in launches:
        run(launch)
    args = launches[-1].args
    counts, cidx, out = args["cnt_ptr"], args["cidx_ptr"], args["out_ptr"]
    assert counts[1].tolist() == [0] * 4 and counts[2].tolist() == [40, 0, 0, 0]
    assert cidx[2, :40].tolist() == list(range(40))
    assert torch.equal(out, T.ref_topk_indices(x, 64))
    assert out[1].tolist() == [-1] * 64 and out[2].tolist() == list(range(40)) + [-1] * 24


def test_fused_select_beyond_its_registers_and_with_every_bound():
    """cap 64: rows with more candidates take the select that reads the lists once per pass; a
    row with fewer stays in registers (its passes below the candidates' common prefix); with 8-bit
    digits too: the reference's indices on every kind of row."""
    x = torch.randn(3, 4096)
    x[1, 50:] = NEG_INF  # 50 candidates at most: in registers
    launches = F.plan_topk_fused(x, 64, config=dict(chunk=1024, cap=64))
    for launch in launches:
        run(launch)
    counts, out = launches[-1].args["cnt_ptr"], launches[-1].args["out_ptr"]
    assert counts[0].sum() > 64 and counts[1].sum() == 50
    assert torch.equal(out, T.ref_topk_indices(x, 64))
    for cfg in (dict(chunk=1024, cap=64), dict(chunk=512, radix_bits=8)):
        for name, x, lens in TC.cases("cpu", width=4096, k=64, bs=2):
            assert TC.check_rows(x, 64, lens, kernel="fused", config=cfg) == 2, (name, cfg)


def test_fused_counter_needs_no_reset():
    """The arrival counters start as whatever the allocator hands out: the maxima kernel zeroes
    them every call, so garbage there (a graph pool's leftovers) changes nothing; every chunk of
    every row arrives once."""
    x = torch.randn(3, 4096)
    x[1] = NEG_INF
    launches = F.plan_topk_fused(x, 64, config=dict(chunk=1024))
    arrived = launches[-1].args["arrived_ptr"]
    arrived.fill_(12345)
    for launch in launches:
        run(launch)
    assert torch.equal(launches[-1].args["out_ptr"], T.ref_topk_indices(x, 64))
    assert arrived.tolist() == [4, 4, 4]


@pytest.mark.parametrize("kernel", T.KERNELS)
def test_kernel_fills_a_given_out_and_a_strided_row(kernel):
    big = torch.randn(3, 5000)
    x = big[:, :4096]  # rows 5000 apart: the row stride is honoured
    out = torch.full((3, 64), 7, dtype=torch.int32)
    got = T.topk_indices_triton(x, 64, out=out, kernel=kernel, config=KERNEL_CONFIGS[kernel])
    assert got is out
    assert torch.equal(out, T.ref_topk_indices(x, 64))


def test_custom_op_on_cpu_is_the_reference():
    x = torch.randn(3, 500)
    x[0, 10:20] = 2.0  # ties
    assert torch.equal(kx.topk_indices_op(x, 12), T.ref_topk_indices(x, 12))
    torch.library.opcheck(torch.ops.csi.topk_indices.default, (x, 12, None))


# ---------------------------------------------------------------- validation


def test_validation_errors():
    x = torch.randn(2, 100)
    lens = torch.tensor([5, 6], dtype=torch.int32)
    bad = [
        (lambda: T.topk_indices_triton(x, 101), "k=101 is larger than the row"),
        (lambda: T.topk_indices_triton(x, 0), "k must be a positive int"),
        (lambda: T.topk_indices_triton(x.double(), 5), "logits must be torch.float32"),
        (lambda: T.topk_indices_triton(x[0], 5), "logits must have 2 dims"),
        (lambda: T.topk_indices_triton(x.t(), 1), "logits must be contiguous in its last dim"),
        (lambda: T.topk_indices_triton(x, 5, lens.long()), "lengths must be torch.int32"),
        (lambda: T.topk_indices_triton(x, 5, lens[:1]), r"lengths must have shape \(2,\)"),
        (
            lambda: T.topk_indices_triton(x, 5, out=torch.empty(2, 4, dtype=torch.int32)),
            "out must have shape",
        ),
        (lambda: T.topk_indices_triton(x, 5, out=torch.empty(2, 5)), "out must be torch.int32"),
        (lambda: T.topk_indices_triton(x, 5, lens.to("meta")), "must be on one device"),
        (lambda: T.topk_indices(x, 101), "k=101 is larger than the row"),
        (
            lambda: T.topk_indices_triton(x, 5, kernel="fused", config=dict(radix_bits=5)),
            "radix_bits must divide 32",
        ),
        (lambda: T.topk_indices_triton(x, 5, kernel="bound", config=dict(radix_bits=5)), "must divide 32"),
        (
            lambda: T.topk_indices_triton(x, 5, kernel="fused", config=dict(chunk=1000)),
            "chunk must be a power of two",
        ),
        (
            lambda: T.topk_indices_triton(x, 5, kernel="fused", config=dict(block=1024)),
            r"unknown config keys \['block'\]",
        ),
        (
            lambda: T.topk_indices_triton(x, 5, kernel="fused", config=dict(bound_passes=0)),
            "bound_passes must be 1 to 4",
        ),
        (
            lambda: T.topk_indices_triton(x, 5, kernel="fused", config=dict(maxnreg=8)),
            "maxnreg must be 0",
        ),
        (lambda: T.topk_indices_triton(x, 5, kernel="sort"), "kernel must be one of bound, fused"),
    ]
    for fn, msg in bad:
        with pytest.raises(ValueError, match=msg):
            fn()


def test_refuses_cpu_tensors_outside_the_interpreter(monkeypatch):
    monkeypatch.setattr(K, "row_maxima_kernel", COMPILED[0])
    monkeypatch.setattr(T, "_topk_kernel", COMPILED[1])
    monkeypatch.setattr(F, "row_bound_kernel", COMPILED[2])
    monkeypatch.setattr(F, "_fused_kernel", COMPILED[3])
    for kernel in T.KERNELS:
        with pytest.raises(ValueError, match="needs CUDA tensors, got cpu"):
            T.topk_indices_triton(torch.randn(2, 100), 5, kernel=kernel)


# ---------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_gpu_check():
    code = (
        "from kernels import topk, topk_check as c; print([c.check('cuda', kernel=k) for k in topk.KERNELS])"
    )
    r = run_without_interpreter(["-c", code], timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]


@pytest.mark.parametrize(
    "kernel, passes",
    [(kernel, passes) for kernel in T.KERNELS for passes in (0, 1, 3) if (kernel, passes) != ("fused", 0)],
)
def test_kernel_with_each_bound(passes, kernel):
    """bound_passes (2 by default, which the other tests run): the bound is the k-th largest
    sub-chunk maximum's top 8*passes bits, or (0, not in the fused kernel) the maximum itself; a
    looser lower bound means more candidates, and each must select the same set on every kind of
    row."""
    cfg = dict(KERNEL_CONFIGS[kernel] or {}, bound_passes=passes)
    for name, x, lens in TC.cases("cpu", width=4096, k=64, bs=2):
        assert TC.check_rows(x, 64, lens, kernel=kernel, config=cfg) == 2, name
    x = TC.cases("cpu", width=65536, k=512, bs=1)[0][1]
    assert TC.check_rows(x, 512, kernel=kernel, config=cfg) == 1


PDL_IN_A_GRAPH = """
import sys, torch
from kernels import topk as T
pdl, kernel = int(sys.argv[1]), sys.argv[2]
x = torch.randn(32, 65536, device="cuda")
x[3, 1000:] = float("-inf")  # a short row, and a padded one
x[5] = float("-inf")
want = T.ref_topk_indices(x, 512)
out = torch.full((32, 512), -7, dtype=torch.int32, device="cuda")
T.topk_indices_triton(x, 512, out=out, config=dict(pdl=pdl), kernel=kernel)  # compile outside the capture
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    T.topk_indices_triton(x, 512, out=out, config=dict(pdl=pdl), kernel=kernel)
for _ in range(3):
    out.fill_(-7)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want), (out != want).sum()
print("same")
"""


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", T.KERNELS)
@pytest.mark.parametrize("pdl", [0, 1])
def test_programmatic_launch_inside_a_graph_matches_torch(pdl, kernel):
    """Each kernel launched as a programmatic dependent of the one before, captured in a CUDA
    graph as the model replays it: the reference's indices, as without (compiled kernels, in a
    process of its own)."""
    r = run_without_interpreter(["-c", PDL_IN_A_GRAPH, str(pdl), kernel], timeout=600)
    assert r.returncode == 0 and "same" in r.stdout, r.stdout[-2000:] + r.stderr[-4000:]
