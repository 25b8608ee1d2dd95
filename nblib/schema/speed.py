"""The suite's speed table as written to outputs/bench-suite/<machine>-<profile>-<commit>/speed.json:
nblib.run.benchtable builds it, nblib.publish.results_runs reads it into docs/results.md."""

from pydantic import BaseModel

__all__ = ["NotebookSpeed", "SpeedTable"]


class NotebookSpeed(BaseModel):
    notebook: str
    status: str
    seconds: float  # the suite's wall time for the notebook: kernel start to HTML
    cpu_seconds: float  # the kernel's CPU time over its phases (nbconvert's in the suite's process)
    phases: dict[str, float]  # phase -> wall seconds
    ratio: float | None = None  # seconds over the previous table's, same notebook


class SpeedTable(BaseModel):
    machine: str
    commit: str
    profile: str
    total_seconds: float
    notebooks: list[NotebookSpeed]
    previous: str | None = None  # the folder of the table compared with
    total_ratio: float | None = None
    # the suite's own wall time, start to last notebook (below total_seconds when lanes overlap)
    wall_seconds: float | None = None
    lanes: int = 1
    wall_ratio: float | None = None  # wall_seconds over the previous table's (or its total)
    # the notebooks the ratios cover, when the two tables do not list the same ones (a run with --only):
    # totals over different notebooks are no regression, so the total compares these alone
    compared: list[str] | None = None
    written: str | None = None  # when the run wrote it (UTC, ISO 8601): which table is newest
