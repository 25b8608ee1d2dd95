"""Tables for notebooks: markdown, so they read the same in JupyterLab and in the HTML writeup."""


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        return ", ".join(map(str, v))
    return str(v)


def markdown_table(rows, columns=None):
    if not rows:
        return "_(none)_"
    columns = columns or list(rows[0])
    head = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n"
    return head + "\n".join("| " + " | ".join(_fmt(r.get(c, "")) for c in columns) + " |" for r in rows)


def table(rows, columns=None):
    from IPython.display import Markdown

    return Markdown(markdown_table(rows, columns))


def say(text):
    """A sentence computed from the data, shown as prose."""
    from IPython.display import Markdown

    return Markdown(text)
