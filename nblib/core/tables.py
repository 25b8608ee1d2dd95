"""Markdown tables: the one writer every table in the project goes through (notebooks, the writeup,
kernel benchmarks, the GPU scripts). Ours, not tabulate's (or pandas' to_markdown, which needs it):
tabulate pads every cell to its column's widest, which more than doubles writeup.md (18.4 kB against
8.6 kB for the committed GPU run, whose findings run long), and a markdown renderer needs no padding."""

from collections.abc import Callable, Iterable, Mapping, Sequence

__all__ = ["NONE", "from_dicts", "head", "line", "markdown"]

NONE = "_(none)_"


def line(cells: Iterable[object]) -> str:
    """One row; a '|' inside a cell is escaped, so a value cannot split its row into more cells."""
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def head(columns: Sequence[str]) -> str:
    """The header row and the rule under it."""
    return line(columns) + "\n|" + "---|" * len(columns)


def markdown(columns: Sequence[str], rows: Iterable[Iterable[object]]) -> str:
    """A table of rows of cells, one per column, each written with str()."""
    return "\n".join([head(columns), *(line(r) for r in rows)])


def from_dicts(
    rows: Sequence[Mapping[str, object]],
    columns: Sequence[str] | None = None,
    fmt: Callable[[object], str] = str,
    empty: str | None = NONE,
) -> str:
    """A table of the dicts in rows, one column per key in columns (the first row's keys when None;
    a missing key -> blank), each value written with fmt. No rows: empty, or just the header when
    empty is None (or the columns are not known)."""
    if not rows and (empty is not None or columns is None):
        return empty or ""
    columns = list(columns or rows[0])
    return markdown(columns, ([fmt(r.get(c, "")) for c in columns] for r in rows))
