"""The profile `python -m nblib window` writes (params/local-<gpu>.yaml), and beside it the search's
record (local-<gpu>.window.json): which GPU, which commit, every point measured and the choice.

The profile is the input profile with trunk_layers the chosen depth, under a comment header that
gives the same facts for a reader of the file; a program reads them from the record
(nblib.publish.results_figures), never from the comments.
"""

import re
import textwrap
from pathlib import Path

import yaml
from pydantic import BaseModel

from nblib.core.files import write_text
from nblib.studies import window


def device_slug(dev):
    """The name in params/local-<slug>.yaml: 'sim' on the simulator, else the GPU's name in lower
    case with each run of other characters as one '-' (NVIDIA GeForce RTX 4090: nvidia-geforce-rtx-4090)."""
    if dev.name == "sim":
        return "sim"
    return re.sub(r"[^a-z0-9]+", "-", dev.device_name().lower()).strip("-") or "gpu"


class PointRecord(BaseModel):
    """One measurement of the search, its counts and cost (setup and runs together)."""

    depth: int
    kind: window.Kind
    side: window.Side
    corrupted_sessions: int
    sessions: int
    seeds: str  # 'seeds 5-6', as the search reports them
    seconds: float

    @classmethod
    def of(cls, p: window.Point):
        return cls(
            depth=p.depth,
            kind=p.kind,
            side=p.side,
            corrupted_sessions=p.k,
            sessions=p.n,
            seeds=p.seeds(),
            seconds=p.setup_s + p.runs_s,
        )

    def line(self):
        return window.point_line(
            self.depth, self.corrupted_sessions, self.sessions, self.side, self.kind, self.seeds, self.seconds
        )


class SearchRecord(BaseModel):
    """What a written profile's search found: the input profile, the GPU, the commit, the command
    that repeats it, every point in order, the chosen depth and why."""

    source: str
    device: str
    commit: str
    command: str
    band: window.Band
    depth: int
    reason: str
    points: list[PointRecord]

    @classmethod
    def of(cls, found: window.Search, command, commit):
        return cls(
            source=found.source,
            device=found.device,
            commit=commit,
            command=command,
            band=found.band,
            depth=found.choice.depth,
            reason=found.choice.reason,
            points=[PointRecord.of(p) for p in found.points],
        )


def record_path(profile_path):
    """local-<gpu>.yaml -> local-<gpu>.window.json, beside it."""
    path = Path(profile_path)
    return path.with_name(f"{path.stem}.window.json")


def render(raw, shapes, record: SearchRecord):
    """The input profile (its file's mapping, `raw`) with the model's shapes written out in full and
    trunk_layers the chosen depth, under a header that gives the search's points."""
    data = {**raw, "model": {**shapes, "trunk_layers": record.depth}}
    head = [
        f"{record.source} tuned for {record.device}: trunk_layers {record.depth} where it has "
        f"{shapes['trunk_layers']}, chosen by `{record.command}` at commit {record.commit}.",
        f"The race is intermittent where the protocol corrupts {record.band.text()} of sessions. "
        + record.reason,
        "Every measurement, in order (depth: sessions corrupted / sessions [Wilson 95%], the band's side):",
    ]
    lines = [w for h in head for w in textwrap.wrap(h, 104)]
    lines += [f"  {p.line()}" for p in record.points]
    lines.append(f"The other keys are {record.source}'s; its comments say why each is what it is.")
    body = yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=104)
    if yaml.safe_load(body) != data:  # a value YAML would read back differently (on/off unquoted)
        raise RuntimeError("the profile does not read back as written")
    return "".join(f"# {x}\n" for x in lines) + body


def write(path, raw, shapes, found: window.Search, command, commit="unknown"):
    """The tuned profile at `path` and its search's record beside it (record_path), each written
    atomically; returns the profile's path. command: the command line that repeats the search."""
    if not found.found:
        raise ValueError("no depth was chosen: nothing to write")
    record = SearchRecord.of(found, command, commit)
    text = render(raw, shapes, record)
    write_text(record_path(path), record.model_dump_json(indent=1) + "\n")
    return write_text(path, text)


def read_records(folder):
    """The search records in `folder` (local-*.window.json), by name."""
    return [
        SearchRecord.model_validate_json(p.read_text())
        for p in sorted(Path(folder).glob("local-*.window.json"))
    ]
