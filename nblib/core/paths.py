"""Where the project lives: the repository root, found from this file (not from the cwd), so
notebooks, child processes and the CLI agree wherever they are started."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NBLIB = ROOT / "nblib"
