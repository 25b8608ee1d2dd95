"""Notebook 06's tables (nblib.studies.engines): a hazard row is the audit it comes from, then the
hazard's summary; the command's run in a child reports what `python -m nblib audit --json` prints."""

import re
import subprocess
import sys

from nblib.core.paths import ROOT
from nblib.instruments.audit.records import HazardRecord, OpRecord, Site, TargetReport, TensorRecord
from nblib.studies import engines

DECODE = "examples/audit/decode_step.py:racy"


def _side(op, stream, tensor, line, freed):
    at = Site(file="examples/audit/m.py", line=line, function="forward", code="x = y")
    t = TensorRecord(name=tensor, persistent=False, nbytes=64, stream="main", allocated_at=at, freed=freed,
                     freed_at=at if freed else None)  # fmt: skip
    return OpRecord(op=op, index=line, stream=stream, access="reads", argument="self", at=at, tensor=t)


def _report(reused):
    h = HazardRecord(kind="write-after-read", reused=reused, addr="0x10", nbytes=64, pairs=3,
                     first=_side("aten::mm", "side", "normed", 7, True),
                     second=_side("aten::add", "main", "hidden", 9, False))  # fmt: skip
    return TargetReport(target="t", backend="sim", label="t", status="hazards", hazards=[h])


def test_a_hazard_row_is_its_target_then_the_hazard_in_the_caller_s_lines():
    t = engines.Target(model="M", form="buggy", spec="m.py:f", expect="hazards")
    [row] = engines.hazard_rows(t, _report(reused=True))
    assert row.model_dump() == dict(
        model="M", form="buggy", backend="sim", kind="write-after-read",
        first="aten::mm on side", first_at="m.py:7 in forward",
        second="aten::add on main", second_at="m.py:9 in forward",
        tensor="normed", allocated_at="m.py:7 in forward", freed_at="m.py:7 in forward",
        reused_by="hidden", pairs=3,
    )  # fmt: skip
    assert list(row.model_dump())[:4] == ["model", "form", "backend", "kind"]


def test_bytes_not_handed_on_name_no_second_tensor():
    t = engines.Target(model="M", form="buggy", spec="m.py:f", expect="hazards")
    [row] = engines.hazard_rows(t, _report(reused=False))
    assert row.reused_by == "-"


def _without_addresses(text):
    return re.sub(r'"addr":"0x[0-9a-f]+"', '"addr":"?"', text)


def test_the_child_reports_what_the_command_prints_as_json():
    run = engines.cli(DECODE, "sim")
    assert run.command == f"python -m nblib audit {DECODE} --backend sim"
    assert run.exit_code == 1 and run.report.status == "hazards", run.stderr
    cmd = [sys.executable, "-m", "nblib", "audit", DECODE, "--backend", "sim", "--json"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == run.exit_code
    command = TargetReport.model_validate_json(done.stdout)
    assert _without_addresses(command.model_dump_json()) == _without_addresses(run.report.model_dump_json())
