"""`python -m nblib audit TARGET` on the simulator: its exit codes (1 a hazard, 0 clean, 2 a failed
capture with its rule, 2 a bad TARGET before any capture), the JSON report, sites that are the target
file's own lines, the DeepSeek-V4 prepare-path transcription with the fused projection on and off,
and nothing left capturing or patched after a failure."""

import gc
import json
import re
import subprocess
import sys

import pytest

from nblib.backends.sim import SimDevice
from nblib.core.paths import ROOT
from nblib.instruments.audit import target as audit_target
from nblib.run import cli

DECODE = "examples/audit/decode_step.py"
DSV4 = "examples/audit/dsv4_attention.py"


@pytest.fixture(autouse=True)
def at_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # TARGET paths and the reported sites are relative to the working directory


def line_of(path, text):
    """The 1-based line of `path` holding `text` (exactly one)."""
    hits = [i for i, line in enumerate((ROOT / path).read_text().splitlines(), 1) if text in line]
    assert len(hits) == 1, (text, hits)
    return hits[0]


def audit_cli(capsys, target, *extra):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["audit", target, "--backend", "sim", *extra])
    out = capsys.readouterr()
    return exit_.value.code, out.out, out.err


def test_a_racy_target_exits_1_and_names_both_ops_the_tensor_and_its_free(capsys):
    code, out, _ = audit_cli(capsys, f"{DECODE}:racy")
    assert code == 1
    assert "write-after-read" in out and "freed, then reused" in out
    assert re.search(r"first +aten::mm \(op \d+\) on stream side reads h ", out)
    assert re.search(r"second aten::mm \(op \d+\) on stream main writes ", out)
    assert f"freed at {DECODE}:{line_of(DECODE, 'del h  #')} in __call__: del h" in out
    assert out.rstrip().endswith("(exit 1)")


@pytest.mark.parametrize("fix", ["join_before_free", "record_stream", "persistent_buffer"])
def test_each_fix_of_the_racy_step_exits_0(capsys, fix):
    code, out, _ = audit_cli(capsys, f"{DECODE}:{fix}")
    assert code == 0, out
    assert "0 hazards" in out and "clean: no cross-stream race" in out


def test_a_capture_that_fails_exits_2_and_names_the_rule(capsys):
    code, out, _ = audit_cli(capsys, f"{DECODE}:host_sync")
    assert code == 2
    assert "the capture failed" in out
    assert f"decode_step.py:{line_of(DECODE, 'if out.sum() > 0')}" in out
    assert "capture rule broken: sync: no host synchronization" in out


def test_json_parses_and_carries_the_hazards_fields(capsys):
    code, out, _ = audit_cli(capsys, f"{DECODE}:racy", "--json", "--label", "decode step")
    assert code == 1
    rep = audit_target.TargetReport.model_validate(json.loads(out))
    assert (rep.status, rep.backend, rep.label, rep.exit_code) == ("hazards", "sim", "decode step", 1)
    h = rep.hazards[0]
    assert h.kind == "write-after-read" and h.reused and h.nbytes > 0
    assert (h.first.stream, h.first.access, h.second.stream, h.second.access) == (
        "side",
        "reads",
        "main",
        "writes",
    )
    t = h.first.tensor
    assert t.name.startswith("h (") and t.stream == "main" and t.freed and not t.persistent
    assert t.allocated_at.line == line_of(DECODE, "h = self.x @ self.w_in")
    assert t.freed_at.line == line_of(DECODE, "del h  #")
    assert h.first.at.line == line_of(DECODE, "self.side_out.copy_(torch.relu(h @ self.w_side))")
    assert h.second.at.line == line_of(DECODE, "up = torch.relu(self.x @ self.w_up)")


def test_every_site_is_a_line_of_the_target_file(capsys):
    _, out, _ = audit_cli(capsys, f"{DECODE}:racy", "--json")
    rep = audit_target.TargetReport.model_validate_json(out)
    sites = [
        s
        for h in rep.hazards
        for side in (h.first, h.second)
        for s in (side.at, *side.called_from, side.tensor.allocated_at, side.tensor.freed_at)
        if s is not None
    ]
    assert len(sites) >= 4 * len(rep.hazards) > 0
    lines = (ROOT / DECODE).read_text().splitlines()
    for s in sites:
        assert s.file == DECODE, s
        assert lines[s.line - 1].strip().startswith(s.code[:40]), s


BAD_TARGETS = [
    ("examples/audit/decode_step.py:no_such_function", "has no function 'no_such_function'"),
    ("no_such_module_for_the_audit:step", "module 'no_such_module_for_the_audit' not found"),
    ("examples/audit/no_such_file.py:step", "file 'examples/audit/no_such_file.py' not found"),
    ("examples/audit/decode_step.py:TOKENS", "is not callable (int)"),
    ("decode_step", "is not module:function or path/to/file.py:function"),
    ("examples/audit/decode_step.py:plain_cuda", "run it with --backend cuda"),
]


@pytest.mark.parametrize(("target", "says"), BAD_TARGETS)
def test_a_bad_target_is_one_line_and_exit_2_before_any_capture(capsys, monkeypatch, target, says):
    def no_capture(*a, **k):
        raise AssertionError("a bad TARGET reached the capture")

    monkeypatch.setattr(audit_target.A, "audit_capture", no_capture)
    code, out, err = audit_cli(capsys, target)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and says in err and err.count("\n") == 1, err


def test_a_builder_that_raises_exits_2_naming_its_line(capsys, tmp_path):
    target = tmp_path / "broken.py"
    target.write_text("def build(dev):\n    raise KeyError('no such checkpoint')\n")
    code, out, _ = audit_cli(capsys, f"{target}:build")
    assert code == 2
    assert f"building the step failed at {target}:2: KeyError" in out


def test_after_a_failed_capture_nothing_captures_and_the_recorder_is_gone():
    dev = SimDevice(seed=0)
    stream = dev.current_stream()
    rep = audit_target.audit(f"{DECODE}:host_sync", device=dev)
    assert rep.status == "failed" and rep.failure.stage == "capture" and rep.failure.rule == "sync"
    assert rep.exit_code == 2 and rep.audit_report is None
    assert not dev.is_current_stream_capturing() and not dev.is_capturing()
    assert audit_target.capturing(dev) == ""
    assert dev.current_stream() is stream
    assert dev.capture_hooks == []
    assert gc.isenabled()
    # the same device audits the next target as if nothing had happened
    assert audit_target.audit(f"{DECODE}:racy", device=dev).status == "hazards"


def test_the_python_api_takes_a_builder_or_a_built_step():
    dev = SimDevice(seed=0)
    build = audit_target.load(f"{DECODE}:record_stream").fn
    assert audit_target.audit(build, device=dev).status == "clean"
    step = audit_target.load(f"{DECODE}:racy").fn(dev)
    rep = audit_target.audit_step(step, dev, target="decode step")
    assert rep.status == "hazards" and rep.target == "decode step"
    assert rep.audit_report.hazards and rep.audit_report.graph is not None  # the captured graph


def test_dsv4_fused_projection_races_on_qkv_a_freed_before_the_join(capsys):
    code, out, _ = audit_cli(capsys, f"{DSV4}:fused", "--json")
    rep = audit_target.TargetReport.model_validate_json(out)
    assert code == 1 and rep.hazards
    del_line = line_of(DSV4, "del qkv_a  #")
    for h in rep.hazards:  # every hazard: stream_kv's read of qkv_a against main's reuse of its bytes
        assert h.kind == "write-after-read" and h.reused
        assert h.first.stream == "side" and h.first.access == "reads"  # stream_kv joins first: "side"
        assert h.first.tensor.name.startswith("qkv_a (")
        assert h.first.tensor.freed_at.line == del_line
        assert h.second.stream == "main" and h.second.access == "writes"
        assert h.second.at.function == "compute_q_b"


def test_dsv4_unfused_projection_is_clean(capsys):
    code, out, _ = audit_cli(capsys, f"{DSV4}:unfused")
    assert code == 0, out


def test_the_command_line_through_python_m_nblib():
    done = subprocess.run(
        [sys.executable, "-m", "nblib", "audit", f"{DECODE}:racy", "--backend", "sim", "--json"],
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr
    rep = audit_target.TargetReport.model_validate_json(done.stdout)
    assert rep.status == "hazards" and rep.hazards[0].first.tensor.freed_at.file == DECODE
