"""The frame every live widget shares: controls, a run button, a progress bar with elapsed time and
ETA, a status line, an HTML view (tables) and a figure (PNG). Results land in plain widget values
and in `state`, so a test can build a panel, set its controls, click, and read what it produced.

A callback's error is shown in the status line in one line naming the control that was moved (or
the button, with every control's value) and what it was set to: ipywidgets calls callbacks from
its comm handler, which logs an exception where a JupyterLab user does not look, and papermill never
runs these callbacks. The exception is also kept in state["error"].
"""

from __future__ import annotations

import html
import io
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import ipywidgets as W
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

__all__ = ["Panel", "Ticker", "png"]


def png(fig: Figure) -> bytes:
    """A matplotlib figure as PNG bytes; the figure is closed (widgets redraw often)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def _shown(value) -> str:
    """A control's value as the error line names it."""
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(map(str, value)) + ")" if value else "(none)"
    return str(value)


def _label(widget, name) -> str:
    return getattr(widget, "description", "") or name


@dataclass
class Panel:
    controls: dict  # name -> the widget the user sets
    button: W.Button | None  # None: the panel redraws on every change of a control (watch)
    extra: list = field(default_factory=list)  # follow-up controls (a step slider, a hazard picker)
    progress: W.IntProgress = field(default_factory=lambda: W.IntProgress(value=0, min=0, max=1))
    status: W.HTML = field(default_factory=W.HTML)
    view: W.HTML = field(default_factory=W.HTML)
    figure: W.Image = field(default_factory=lambda: W.Image(format="png"))
    state: dict = field(default_factory=dict)
    box: W.VBox = None

    def __post_init__(self):
        self.progress.layout = W.Layout(width="40%")
        head = [*self.controls.values(), *([self.button] if self.button is not None else [])]
        self.box = W.VBox(
            [
                W.HBox(head),
                W.HBox([self.progress, self.status]),
                *self.extra,
                self.figure,
                self.view,
            ]
        )

    def _repr_mimebundle_(self, **kwargs):  # a panel as a cell's last value shows the widgets
        return self.box._repr_mimebundle_(**kwargs)

    def value(self, name: str) -> Any:
        return self.controls[name].value

    def say(self, text: str, error: bool = False) -> None:
        color = "#a00" if error else "#333"
        self.status.value = f"<span style='color:{color}'>{html.escape(text)}</span>"

    def show(self, fig: Figure | None = None, tables: Iterable[tuple[str, str]] = ()) -> None:
        """Replace the figure (a matplotlib Figure) and the tables ((title, html) pairs)."""
        if fig is not None:
            self.figure.value = png(fig)
        if tables:
            self.view.value = "".join(f"<h4>{html.escape(t)}</h4>{h}" for t, h in tables)

    def settings(self) -> str:
        """Every control's value, as the error line of a click names them."""
        return ", ".join(f"{_label(w, k)} = {_shown(w.value)}" for k, w in self.controls.items())

    def fail(self, where: str, e: Exception) -> None:
        """Show an exception in the status line, in one line: where (the control and its value)
        and what went wrong."""
        self.state["error"] = e
        self.progress.bar_style = "danger"
        what = " ".join(str(e).split()) or type(e).__name__
        self.say(f"error at {where}: {type(e).__name__}: {what}", error=True)

    def on_click(self, fn: Callable[[Panel, Ticker], str]) -> Callable[..., None]:
        """Run fn(panel, tick) on click, with the button disabled while it runs; fn returns a
        one-line summary. tick(total) starts the bar; then tick() per unit of work, tick(text=...)
        to show a line of progress."""

        def handler(_=None):
            self.button.disabled = True
            self.state.pop("error", None)
            where = f"'{self.button.description}' with {self.settings()}"
            t0 = time.perf_counter()
            tick = Ticker(self, t0)
            try:
                summary = fn(self, tick)
                self.progress.value, self.progress.bar_style = self.progress.max, "success"
                self.say(f"{summary} ({time.perf_counter() - t0:.1f} s)")
            except Exception as e:  # shown, not raised: see the module docstring
                self.fail(where, e)
            finally:
                self.button.disabled = False

        self.button.on_click(handler)  # type: ignore[union-attr]  # on_click is for a panel with a button
        return handler

    def watch(
        self, widget: W.ValueWidget, fn: Callable[[], object], name: str | None = None
    ) -> Callable[..., None]:
        """Call fn() whenever widget's value changes; an exception shows as one line naming the
        control (its description, else name) and the value it was moved to."""

        def handler(change=None):
            self.state.pop("error", None)
            try:
                fn()
            except Exception as e:  # shown, not raised: see the module docstring
                self.fail(f"{_label(widget, name or 'control')} = {_shown(widget.value)}", e)

        widget.observe(handler, "value")
        return handler

    def click(self) -> None:
        self.button.click()  # type: ignore[union-attr]  # a panel with a button


class Ticker:
    """The progress callback the study functions take (`progress=`): each call is one unit done."""

    def __init__(self, panel: Panel, t0: float):
        self.panel, self.t0 = panel, t0

    def start(self, total: int, text: str = "running") -> None:
        bar = self.panel.progress
        bar.max, bar.value, bar.bar_style = max(1, total), 0, "info"
        self.panel.say(text)

    def __call__(self, text: str | None = None) -> None:
        bar = self.panel.progress
        bar.value = min(bar.max, bar.value + 1)
        spent = time.perf_counter() - self.t0
        eta = spent / bar.value * (bar.max - bar.value)
        line = f"{bar.value}/{bar.max} · {spent:.0f} s · ETA {eta:.0f} s"
        self.panel.say(f"{line} · {text}" if text else line)
