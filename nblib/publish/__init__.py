"""publish: the top layer. Profiles and their schema, the papermill suite runner and CLI, the
writeup, tables, plots and widgets. May import every other layer."""
