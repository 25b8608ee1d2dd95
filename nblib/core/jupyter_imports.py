"""Importing the Jupyter stack (nbformat, which papermill and nbconvert load) without its slowest
optional import.

jsonschema, which nbformat validates notebooks with, imports rfc3987_syntax when it is installed
(jupyter-events requires it) to check the "iri" string format. That import builds a Lark grammar:
2.3 s of a 7.3 s `import nblib.run.suite` on the 2-core CI machine, paid by every process that
runs or renders a notebook (the suite, each sweep point, each test that starts one). No notebook
schema uses the "iri" formats. A None entry in sys.modules makes the import raise ImportError,
which jsonschema catches: it then leaves those two format checkers out, as when the package is
absent; every other check of a notebook stays.
"""

import sys

__all__ = ["SKIPPED", "skip_unused_format_checkers"]

SKIPPED = ("rfc3987_syntax",)


def skip_unused_format_checkers() -> None:
    """Block SKIPPED's imports in this process, unless one was imported already (then it is kept)."""
    for name in SKIPPED:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]  # None blocks the import
