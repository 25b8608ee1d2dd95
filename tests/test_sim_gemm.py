"""The simulator's bf16 matrix products (nblib.backends.sim.gemm): fp32 products and sums rounded
once to bf16, checked against float64 products; other dtypes as torch computes them; a capture
still records aten::mm and its replay gives the eager step's bits."""

import pytest
import torch

from nblib.backends.sim import SimDevice


def bf16_ulp(x):
    """The spacing of bf16 values at |x| (8 bits of mantissa)."""
    e = torch.floor(torch.log2(x.abs().clamp(min=2.0**-126)))
    return torch.exp2(e - 7)


@pytest.mark.parametrize("shape", [(1, 64, 32), (8, 256, 1024), (40, 128, 7)])
def test_bf16_mm_is_the_exact_product_rounded_once(shape):
    m, k, n = shape
    g = torch.Generator().manual_seed(m * k + n)
    a = torch.randn(m, k, generator=g).bfloat16()
    b = torch.randn(k, n, generator=g).bfloat16()
    got = a @ b
    exact = a.double() @ b.double()
    assert got.dtype == torch.bfloat16 and got.shape == (m, n)
    err = (got.double() - exact).abs()
    # one rounding: within half an ulp of bf16, plus the fp32 sums' own error, far below it
    assert (err <= 0.5 * bf16_ulp(exact) + 1e-5 * exact.abs().clamp(min=1)).all()
    assert (got == exact.bfloat16()).float().mean() > 0.99


def test_bf16_bmm_matches_mm_per_batch_entry_and_the_exact_product():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(3, 8, 128, generator=g).bfloat16()
    b = torch.randn(3, 128, 50, generator=g).bfloat16()
    got = torch.bmm(a, b)
    exact = torch.bmm(a.double(), b.double())
    assert got.dtype == torch.bfloat16
    assert ((got.double() - exact).abs() <= 0.5 * bf16_ulp(exact) + 1e-5 * exact.abs().clamp(min=1)).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_other_dtypes_keep_their_precision(dtype):
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(16, 64, generator=g, dtype=dtype), torch.randn(64, 9, generator=g, dtype=dtype)
    got = a @ b
    assert got.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(got.double(), a.double() @ b.double(), rtol=tol, atol=tol)


def test_mismatched_dtypes_still_raise():
    with pytest.raises(RuntimeError):
        torch.randn(2, 3).bfloat16() @ torch.randn(3, 2)


def test_a_captured_mm_is_recorded_as_aten_mm_and_replays_the_eager_bits():
    dev = SimDevice(seed=0)
    g0 = torch.Generator().manual_seed(3)
    x = torch.randn(8, 256, generator=g0).bfloat16()
    w = torch.randn(256, 512, generator=g0).bfloat16()
    out = torch.empty(8, 512, dtype=torch.bfloat16)
    eager = torch.relu(x @ w)
    g = dev.CUDAGraph()
    s = dev.Stream()
    s.wait_stream(dev.current_stream())
    with dev.stream(s), dev.graph(g, pool=dev.graph_pool_handle()):
        out.copy_(torch.relu(x @ w))
    assert [n.op for n in g.nodes] == ["aten.mm.default", "aten.relu.default", "aten.copy_.default"]
    g.replay()
    assert torch.equal(out.view(torch.int16), eager.view(torch.int16))
