"""nblib: the capture-corruption investigation suite's library.

Packages by layer, lowest first; a package imports only from the ones above it in this list
(and from `kernels`, which sits beside nblib and imports nothing of it but `nblib.core`):

  core         plain helpers with no torch state: statistics, atomic writes, provenance
  backends     the device facade (cuda | sim) and the CPU simulator
  engine       the miniature decode path: model, graph runner, workload, persistent buffers
  instruments  what an investigator attaches to the engine: canary, gediff, trace + audit, CSAN, overhead
  studies      the functions behind each notebook: reproduce, overlap, fix
  publish      profiles, the suite runner, the writeup, tables, plots, widgets, the CLI

tests/test_layers.py checks the rule and that no import cycle exists.
"""
