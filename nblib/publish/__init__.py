"""publish: the top layer. Profiles and their schema (params), the papermill suite runner and the
CLI (suite, cli), the writeup (report), tables and figures (show, plots), the live panels
(widgets, panel, pagemap), parameter sweeps locally or on Ray (sweep, sweep_table, raysweep) and
the static site checked in a browser (site, pages, browse). May import every other layer."""
