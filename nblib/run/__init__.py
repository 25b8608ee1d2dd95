"""run: the top layer, what executes. Notebook setup (notebook: `nblib.setup`), the headless suite
with lanes (suite), parameter sweeps locally or on Ray (sweep, sweep_table, raysweep), the speed
table (benchtable) and the command line (cli: `python -m nblib ...`). May import every other layer."""

from nblib.core.jupyter_imports import skip_unused_format_checkers

skip_unused_format_checkers()  # before papermill, nbformat or nbconvert is imported
