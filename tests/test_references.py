"""nblib.engine.references: the eager references are computed once per workload and give the same
verdicts, a step with other inputs is never looked up, a folder hands them to the next process, and
a file of another group is never trusted."""

import torch
from models import PHASES

from nblib.backends import device
from nblib.engine import build, references
from nblib.engine.runner import Runner
from nblib.engine.workload import WorkloadConfig, run_sessions

WORKLOAD = dict(sessions=3, rounds=1, ctx_min=64, ctx_max=200, turn_ctx=64, out_min=4, out_max=6)


def _run(refs, overlap, seed=0):
    dev = device.get("sim")
    m = build.model(dev, PHASES, overlap=overlap)
    runner = Runner(m, [1, 2], references=refs).capture()
    w = WorkloadConfig(**WORKLOAD, concurrency=2, seed=seed)
    return run_sessions(runner, w)


def test_references_are_computed_once_per_workload_and_give_the_same_verdicts():
    refs = references.References()
    alone = _run(None, "off")
    first = _run(refs, "on")
    assert refs.hits == 0 and refs.misses == first["steps"]
    second = _run(refs, "off")  # another configuration, the same workload: every step reused
    assert refs.hits == second["steps"] and refs.misses == first["steps"]
    assert second["step_log"] == alone["step_log"]
    _run(refs, "off", seed=1)  # another workload: computed afresh
    assert refs.misses > first["steps"]


def test_a_step_with_other_inputs_is_never_looked_up():
    refs = references.References()
    dev = device.get("sim")
    m = build.model(dev, PHASES)
    runner = Runner(m, [2], "eager", references=refs)
    batch = build.full_batch(m, 2, ctx=100)
    w = WorkloadConfig(**WORKLOAD, concurrency=2)
    a = refs.get(runner, w, 0, tuple(batch))
    other = (batch.tokens + 1, batch.page_table, batch.seq_lens, batch.store_slots)
    b = refs.get(runner, w, 0, other)
    assert refs.misses == 2 and refs.hits == 0
    assert not torch.equal(a.out, b.out)


def test_references_in_a_folder_are_read_by_the_next_process_and_give_the_same_verdicts(tmp_path):
    alone = _run(None, "off")
    first = references.References(tmp_path)
    a = _run(first, "on")  # computes every step, then writes its group (run_sessions flushes)
    assert first.misses == a["steps"] and len(list(tmp_path.glob("*.pt"))) == 1
    later = references.References()  # as a later notebook's process would
    later.attach(tmp_path)
    b = _run(later, "off")
    assert later.read == a["steps"] and later.hits == b["steps"] and later.misses == 0
    assert b["step_log"] == alone["step_log"]  # the steps read back give the verdicts computing gives
    _run(later, "on", seed=1)  # another workload: computed afresh and written beside the first
    assert later.misses > 0 and len(list(tmp_path.glob("*.pt"))) == 2


def test_a_references_file_of_another_group_is_never_trusted(tmp_path):
    refs = references.References(tmp_path)
    _run(refs, "on")
    [path] = tmp_path.glob("*.pt")
    data = torch.load(path, weights_only=True)
    data["group"] = "another group"
    torch.save(data, path)
    later = references.References(tmp_path)
    run = _run(later, "on")
    assert later.read == 0 and later.misses == run["steps"]
