"""nblib: the capture-corruption investigation suite's library.

Packages by layer, lowest first; a package imports only from the ones above it in this list
(and from `kernels`, which sits beside nblib and imports nothing of it but `nblib.core`):

  core         helpers that hold no model, device or stream: statistics, atomic writes, provenance, paths
  backends     the device facade (cuda | sim) and the CPU simulator
  engine       the miniature decode path: model, graph runner, workload, persistent buffers, build
  instruments  what an investigator attaches to the engine: canary, gediff, trace + audit, CSAN, overhead
  studies      the functions behind each notebook: protocol, reproduce, designs, overlap, fix, window, engines
  schema       the profile schema (params/*.yaml, every key typed)
  publish      what a reader sees: run index, notebook pages, writeup, tables, plots, site, results doc
  lab          the live JupyterLab panels, calling the same study functions as batch runs
  run          notebook setup, the headless suite, sweeps, the speed table, the CLI

tests/test_layers.py checks the rule and that no import cycle exists. docs/architecture.md draws it.

`nblib.setup(notebook, globals())` is every notebook's setup cell (nblib.run.notebook.setup).
"""


def __getattr__(name):
    # Lazy on purpose: setup pulls torch, pydantic and the engine (about 2 s to import, measured on
    # the 2-core CI machine), which `import nblib.core.stats` or kernels/ should not pay for.
    if name == "setup":
        from nblib.run.notebook import setup

        return setup
    raise AttributeError(f"module 'nblib' has no attribute {name!r}")
