"""Where the project lives: the repository root, found from this file (not from the cwd), so
notebooks, child processes and the CLI agree wherever they are started; and the notebooks of the
suite, in the order they run (05, the writeup, reads what 00 to 04 wrote; 06 audits engine code
from outside the project and 07 runs the whole method on it, both apart from the writeup)."""

from pathlib import Path

__all__ = ["MEASURING", "NBLIB", "NOTEBOOKS", "NOTEBOOK_DIR", "ROOT"]

ROOT = Path(__file__).resolve().parents[2]
NBLIB = ROOT / "nblib"
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = (
    "00_reproduce",
    "01_canary",
    "02_graph_vs_eager",
    "03_stream_overlap",
    "04_persistent_buffer_fix",
    "05_report",
    "06_audit_your_engine",
    "07_method_on_your_engine",
)
MEASURING = NOTEBOOKS[: NOTEBOOKS.index("05_report")]  # what the writeup reads; 05 only reads them
