"""publish: what a reader sees of a run. The run folder's index and each notebook's HTML (runindex,
pages), the writeup and its backend notes (report, caveats), tables and figures (show, plots), the
static site checked in a browser (site, browse), and docs/results.md from committed results
(results_doc, results_figures). Imports the layers below; never the lab or the run layer."""

from nblib.core.jupyter_imports import skip_unused_format_checkers

skip_unused_format_checkers()  # before papermill, nbformat or nbconvert is imported
