"""`python -m nblib audit TARGET --confirm` on the simulator: each hazard replayed with its losing order
forced and compared with an eager run from the same state.

What a right confirm does, checked against targets written here: a hazard whose order changes a value
is confirmed; a fixed form forced the same way stays equal to eager; a read-before-write in the
capture's pool is caught only because the hazard's bytes hold a sentinel (every replay writes the same
value there, so a stale read of the last replay's would pass); persistent state the step updates in
place is restored before each run and after the check; a hazard whose reader's result is discarded is
not confirmed. The CUDA form (a spin kernel captured before the delayed op) is in tests/test_gpu_*.
"""

import contextlib
import json

import pytest
import torch

from nblib.backends.sim import SimDevice
from nblib.core.paths import ROOT
from nblib.instruments.audit import confirm as audit_confirm
from nblib.instruments.audit import target as audit_target
from nblib.instruments.audit.zoo import CASES
from nblib.run import cli

DECODE = "examples/audit/decode_step.py"
N = 4096


@pytest.fixture(autouse=True)
def at_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def confirmed(build, replays=6):
    dev = SimDevice()
    step = build(dev)
    rep = audit_target.audit_step(step, dev)
    return rep, audit_confirm.confirm(step, dev, rep, replays=replays)


def test_the_decode_steps_race_is_confirmed_and_each_fix_stays_equal_to_eager_when_forced():
    load = lambda name: audit_target.load(f"{DECODE}:{name}").fn  # noqa: E731
    rep, c = confirmed(load("racy"))
    assert rep.status == "hazards" and len(c.hazards) == len(rep.hazards) == 2
    for k in c.hazards:
        assert k.differing == k.replays == 6 and k.max_abs > 0.1
        assert k.delayed.startswith("aten::mm") and k.delayed.endswith("on side")  # the side's read of h
    for fix in ("join_before_free", "record_stream", "persistent_buffer"):
        rep, c = confirmed(load(fix))
        assert rep.status == "clean" and c.hazards == []
        assert c.branches and all(b.differing == 0 and b.delay_us > 0 for b in c.branches), fix
        assert c.natural.differing == 0


def raw_in_pool(dev):
    """h is written on a side stream and read on main with no wait: a read-after-write on the pool's
    bytes. Each replay writes h the same value, so without a sentinel a read before the write sees
    the previous replay's h, which is right."""
    side, x = dev.Stream(), torch.randn(N, generator=torch.Generator().manual_seed(1))
    out = torch.zeros(N)

    def step():
        main = dev.current_stream()
        side.wait_stream(main)
        with dev.stream(side):
            h = x * 2.0
        out.copy_(h + 1.0)  # main reads h: the wait for side is missing
        main.wait_stream(side)

    return step


def test_a_read_before_the_write_in_the_pool_is_caught_by_the_sentinel():
    rep, c = confirmed(raw_in_pool)
    (h,) = rep.hazards
    assert h.kind == "read-after-write" and not h.first.tensor.persistent
    (k,) = c.hazards
    assert k.differing == k.replays and k.nonfinite  # 0xFF bytes: NaN where x * 2 + 1 was expected
    assert k.tensor.startswith("persistent bytes written by aten::copy_")


def accumulate(dev):
    """A KV-cache-like update in place (cache += x on a side stream, joined): clean, and every run
    differs from the last unless the state is restored before it."""
    side = dev.Stream()
    cache, x = torch.zeros(N), torch.ones(N)

    def step():
        main = dev.current_stream()
        side.wait_stream(main)
        with dev.stream(side):
            cache.add_(x)
        main.wait_stream(side)
        return cache.sum()

    step.cache = cache
    return step


def test_persistent_state_is_restored_before_each_run_and_left_as_it_was():
    dev = SimDevice()
    step = accumulate(dev)
    step.cache.fill_(3.0)
    rep = audit_target.audit_step(step, dev)
    c = audit_confirm.confirm(step, dev, rep, replays=5)
    assert rep.status == "clean"
    assert c.natural.differing == 0 and all(b.differing == 0 for b in c.branches)
    assert torch.equal(step.cache, torch.full((N,), 3.0))


def test_a_step_that_leaves_nothing_to_compare_says_so_instead_of_not_confirmed():
    """Its race is real, but its only result dies in the pool: no value to compare with eager."""
    dev = SimDevice()
    x, side = torch.ones(N), dev.Stream()

    def step():
        main = dev.current_stream()
        h = x * 2.0
        side.wait_stream(main)
        with dev.stream(side):
            h.sum()
        del h
        torch.ones(N) * 3.0  # main may take h's block while the side stream reads it
        main.wait_stream(side)

    rep = audit_target.audit_step(step, dev)
    c = audit_confirm.confirm(step, dev, rep, replays=2)
    assert rep.status == "hazards" and c.compared == 0
    assert c.lines()[0].startswith("nothing to compare")


SINGLE = [c for c in CASES if c.name != "shared_pool_two_captures"]  # two captures: no one step
HARMLESS = {"fan_in_partial_wait"}  # its readers' results are discarded: no value depends on the order


@pytest.mark.parametrize("case", SINGLE, ids=lambda c: c.name)
def test_every_zoo_race_is_confirmed_unless_its_reads_are_discarded_and_every_twin_stays_equal(case):
    racy, twin = (confirmed(lambda dev, r=r: case.build(dev, r)[0], replays=3) for r in (True, False))
    assert racy[0].status == "hazards" and twin[0].status == "clean"
    forced = [k.differing for k in racy[1].hazards]
    if case.name in HARMLESS:
        assert forced and all(d == 0 for d in forced)
    else:
        assert any(d == 3 for d in forced), forced
    assert all(b.differing == 0 for b in twin[1].branches) and twin[1].natural.differing == 0


def test_the_cli_reports_each_hazard_confirmed_in_text_and_json(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["audit", f"{DECODE}:racy", "--backend", "sim", "--confirm", "--replays", "4", "--json"])
    assert e.value.code == 1
    out = json.loads(capsys.readouterr().out)
    for h in out["hazards"]:
        assert (h["confirmed"], h["replays"], h["differing"]) == (True, 4, 4)
        assert h["max_abs"] > 0 and h["tensor"]
    with pytest.raises(SystemExit) as e:
        cli.main(["audit", f"{DECODE}:racy", "--backend", "sim", "--confirm", "--replays", "3"])
    text = capsys.readouterr().out
    assert e.value.code == 1
    assert text.count("confirmed: 3 of 3 replays differ from eager") == 2
    assert "2 hazards, 2 confirmed" in text


def test_a_bad_replay_count_is_one_line_before_any_capture(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["audit", f"{DECODE}:racy", "--backend", "sim", "--confirm", "--replays", "0"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "--replays" in err


@pytest.mark.gpu
@pytest.mark.parametrize(
    "target",
    [f"{DECODE}:racy", "examples/audit/dsv4_attention.py:fused", "examples/audit/hf_moe.py:qwen2_moe"],
)
def test_on_cuda_every_hazard_of_a_racy_target_is_confirmed_by_a_spin_kernel(target):
    rep = audit_target.audit(target, backend="cuda", confirm=20)
    assert rep.status == "hazards" and rep.confirm is not None
    assert all(h.confirmed and h.differing > 0 for h in rep.hazards), rep.text()
    # the time --confirm adds is a figure (scripts/confirm_table.py records it per target), not a test
    print(f"{target}: --confirm added {rep.confirm.seconds:.1f} s")


@pytest.mark.gpu
@pytest.mark.parametrize(
    "target",
    [
        f"{DECODE}:join_before_free",
        f"{DECODE}:record_stream",
        "examples/audit/dsv4_attention.py:unfused",
        "examples/audit/hf_moe.py:qwen2_moe_record_stream",
    ],
)
def test_on_cuda_a_fixed_form_forced_branch_by_branch_stays_equal_to_eager(target):
    rep = audit_target.audit(target, backend="cuda", confirm=20)
    assert rep.status == "clean" and rep.confirm.branches
    assert all(b.differing == 0 for b in rep.confirm.branches), rep.text()


@pytest.mark.gpu
@pytest.mark.parametrize("case", SINGLE, ids=lambda c: c.name)
def test_on_cuda_every_zoo_race_is_confirmed_unless_its_reads_are_discarded(case):
    from nblib.backends.device import get

    dev = get("cuda")
    for racy in (True, False):
        step = case.build(dev, racy)[0]
        rep = audit_target.audit_step(step, dev)
        c = audit_confirm.confirm(step, dev, rep, replays=20)
        if not racy:
            assert all(b.differing == 0 for b in c.branches)
        elif case.name in HARMLESS:
            assert all(k.differing == 0 for k in c.hazards)
        else:
            assert any(k.differing > 0 for k in c.hazards), [k.model_dump() for k in c.hazards]


@pytest.mark.parametrize(
    "dtype, bits", [(torch.float32, torch.int32), (torch.bfloat16, torch.int16), (torch.float16, torch.int16)]
)
def test_a_value_one_ulp_from_eager_is_rounding_and_a_stale_one_is_a_difference(dtype, bits):
    want = torch.linspace(1.0, 1.5, 64).to(dtype)
    one_ulp = (want.view(bits) + 1).view(dtype)  # the next representable value up (positive floats)
    assert bool((one_ulp > want).all())
    stale = want.clone()
    stale[7] = 3.0
    nan = want.clone()
    nan[0] = float("nan")
    got = [("ulp", one_ulp), ("stale", stale), ("nan", nan), ("same", want.clone())]
    diffs = {d.name: d for d in audit_confirm.differences(got, [(n, want) for n, _ in got])}
    assert set(diffs) == {"ulp", "stale", "nan"}
    assert diffs["ulp"].rounding and not diffs["stale"].rounding and not diffs["nan"].rounding
    assert diffs["nan"].nonfinite and abs(diffs["stale"].max_abs - (3.0 - float(want[7]))) < 1e-2
    assert [d.name for d in audit_confirm.beyond_rounding(got, [(n, want) for n, _ in got])] == [
        "stale",
        "nan",
    ]


def test_integers_are_compared_bit_for_bit():
    want = torch.arange(16, dtype=torch.int32)
    got = want.clone()
    got[3] += 1
    (d,) = audit_confirm.differences([("idx", got)], [("idx", want)])
    assert not d.rounding and d.max_abs is None


def test_a_recaptured_graph_replays_while_what_owns_its_static_inputs_lives():
    # On CUDA the forced order captures the step again; the graph replays from the addresses of the
    # static inputs its runner owns, so that runner must outlive every replay of the graph
    import gc
    import weakref
    from types import SimpleNamespace as NS

    class Owner:
        pass

    class Graph:
        def __init__(self, owner=None):
            self.owner = weakref.ref(owner) if owner is not None else None
            self.replays = 0

        def replay(self):
            gc.collect()
            assert self.owner is None or self.owner() is not None, "replayed after its owner died"
            self.replays += 1

    class Event:
        def record(self):
            pass

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return 0.01

    dev = NS(
        name="cuda",
        Event=lambda enable_timing=False: Event(),
        synchronize=lambda: None,
        spin=lambda seconds: None,
        serial=contextlib.nullcontext,
    )
    side_op = NS(name="aten::add", index=1, stream="side", accesses=[])
    main_op = NS(name="aten::mul", index=0, stream="main", accesses=[])
    trace = NS(
        ops=[main_op, side_op],
        events=[NS(kind="op", op=main_op, stream="main"), NS(kind="op", op=side_op, stream="side")],
    )
    out = torch.zeros(2)
    made = []

    def recapture(before):
        owner = Owner()
        g = Graph(owner)
        made.append(g)
        return audit_confirm.Captured(trace, [], g, out, owner=owner)

    captured = audit_confirm.Captured(trace, [], Graph(), out, recapture)
    rep = audit_confirm.confirm(lambda: out, dev, captured, replays=3)
    assert made and all(g.replays == 3 for g in made)
    assert [c.differing for c in rep.branches] == [0]


def test_a_step_whose_eager_runs_differ_confirms_nothing_and_says_undecided(capsys):
    # the vLLM-Ascend sampler draws exponential noise: two eager runs already differ, so a replay that
    # differs from eager proves nothing about the race the audit names
    sampler = str(ROOT / "examples/field/vllm_ascend_sampler_q.py:buggy")
    with pytest.raises(SystemExit) as e:
        cli.main(["audit", sampler, "--backend", "sim", "--confirm", "--replays", "3", "--json"])
    assert e.value.code == 1  # the hazard is still named: the exit code is the audit's
    out = json.loads(capsys.readouterr().out)
    assert out["hazards"] and not any(h["confirmed"] for h in out["hazards"])
    assert out["confirm"]["eager_differs"]
    with pytest.raises(SystemExit):
        cli.main(["audit", sampler, "--backend", "sim", "--confirm", "--replays", "3"])
    text = capsys.readouterr().out
    assert "undecided: two eager runs of the step differ" in text
    assert "1 hazard, undecided" in text


def index_in_pool(dev, tables=1):
    """Indices made on a side stream and read on main with no wait: under the forced order main reads
    the sentinel's bytes (-1 as int64), an index outside its table, and index_select raises. `tables`
    such reads, each index made by its own op on the side stream (one forced schedule each)."""
    side = dev.Stream()
    src = torch.arange(64)
    table = torch.randn(64, generator=torch.Generator().manual_seed(2))
    outs = [torch.zeros(64) for _ in range(tables)]

    def step():
        main = dev.current_stream()
        side.wait_stream(main)
        with dev.stream(side):
            idx = [src.roll(k + 1) for k in range(tables)]  # one op each, every index in range
        for out, i in zip(outs, idx):
            out.copy_(torch.index_select(table, 0, i))
        main.wait_stream(side)

    return step


def test_a_forced_replay_that_raises_confirms_the_hazard_and_names_the_error():
    rep, c = confirmed(index_in_pool)
    (k,) = c.hazards
    assert k.confirmed and k.raised == k.differing == k.replays == 6
    assert k.error.startswith("IndexError: index out of range")
    assert "6 raised: IndexError" in "\n".join(c.lines())
    rep.add_confirm(c)
    assert rep.hazards[0].confirmed and rep.hazards[0].error == k.error
    assert c.context_lost is None


def test_after_a_replay_ends_the_cuda_context_the_rest_is_reported_not_run(monkeypatch):
    # the simulator's IndexError stands in for a device-side assert: every later CUDA call would fail
    monkeypatch.setattr(audit_confirm, "context_lost", lambda dev, error: True)
    rep, c = confirmed(lambda dev: index_in_pool(dev, tables=2))
    assert len(rep.hazards) == 2 and c.natural.raised == 0
    first, second = c.hazards
    assert first.raised == first.replays == 1 and first.confirmed
    assert second.replays == 0 and not second.confirmed and second.error.startswith("not run")
    assert c.context_lost == first.delayed
    text = "\n".join(c.lines())
    assert f"the CUDA context ended at {first.delayed}" in text and "hazard 2 not checked" in text


def test_only_a_cuda_error_on_cuda_ends_the_context():
    cuda, sim = type("D", (), {"name": "cuda"})(), type("D", (), {"name": "sim"})()
    assert audit_confirm.context_lost(cuda, RuntimeError("CUDA error: device-side assert triggered"))
    assert not audit_confirm.context_lost(cuda, RuntimeError("CUDA out of memory. Tried to allocate"))
    assert not audit_confirm.context_lost(sim, RuntimeError("CUDA error: device-side assert triggered"))
