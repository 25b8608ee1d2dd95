"""studies: the functions behind each notebook, one module per question: reproduce (the matrix),
overlap (toggles and the audit), fix (the fix, proved and timed). They return plain records that
the notebooks show and results.json stores. May import every layer below; never publish."""
