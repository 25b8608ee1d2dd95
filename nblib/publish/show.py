"""Tables for notebooks: markdown, so they read the same in JupyterLab and in the HTML writeup.
tabulate lays them out; _fmt decides how a value reads (floats to 4 significant digits, lists
joined), the same in every table."""

from IPython.display import Markdown
from tabulate import tabulate


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        return ", ".join(map(str, v))
    return str(v)


def _cells(rows, columns):
    return [[_fmt(r.get(c, "")) for c in columns] for r in rows]


def markdown_table(rows, columns=None):
    if not rows:
        return "_(none)_"
    columns = columns or list(rows[0])
    cells = [[c.replace("|", "\\|") for c in row] for row in _cells(rows, columns)]
    return tabulate(cells, headers=columns, tablefmt="pipe", disable_numparse=True)


def html_table(rows, columns=None):
    """The same table as HTML (values escaped), for widgets and the published site."""
    if not rows:
        return "<p><em>(none)</em></p>"
    columns = columns or list(rows[0])
    return tabulate(_cells(rows, columns), headers=columns, tablefmt="html", disable_numparse=True)


def table(rows, columns=None):
    return Markdown(markdown_table(rows, columns))


def say(text):
    """A sentence computed from the data, shown as prose."""
    return Markdown(text)
