"""Tables for notebooks: markdown, so they read the same in JupyterLab and in the HTML writeup;
HTML (through pandas) for widgets and the published site. _fmt decides how a value reads (floats
to 4 significant digits, lists joined), the same in every table."""

from collections.abc import Mapping, Sequence

import pandas as pd
from IPython.display import Markdown, display

from nblib.core import tables

__all__ = ["html_table", "markdown_table", "say", "table"]


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        return ", ".join(map(str, v))
    return str(v)


def _cells(rows, columns):
    return [[_fmt(r.get(c, "")) for c in columns] for r in rows]


def markdown_table(rows: Sequence[Mapping[str, object]], columns: Sequence[str] | None = None) -> str:
    """The dicts in rows as markdown (nblib.core.tables), values written by _fmt."""
    return tables.from_dicts(rows, columns, fmt=_fmt)


def html_table(rows: Sequence[Mapping[str, object]], columns: Sequence[str] | None = None) -> str:
    """The same table as HTML, values escaped."""
    if not rows:
        return "<p><em>(none)</em></p>"
    columns = columns or list(rows[0])
    return pd.DataFrame(_cells(rows, columns), columns=columns).to_html(index=False, border=0)


def table(rows: Sequence[Mapping[str, object]], columns: Sequence[str] | None = None) -> Markdown:
    return Markdown(markdown_table(rows, columns))


def say(text: str) -> None:
    """Display a sentence computed from the data as prose, wherever the call stands in a cell (a
    value returned mid-cell is never shown, so a conclusion must not depend on being the last line).
    Returns None, so a call on a cell's last line is not shown twice."""
    display(Markdown(text))
