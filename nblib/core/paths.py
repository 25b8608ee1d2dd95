"""Where the project lives: the repository root, found from this file (not from the cwd), so
notebooks, child processes and the CLI agree wherever they are started; and the notebooks of the
suite, in the order they run (05, the writeup, reads what 00 to 04 wrote)."""

from pathlib import Path

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
)
MEASURING = NOTEBOOKS[:-1]  # the ones that measure; 05 only reads their results
