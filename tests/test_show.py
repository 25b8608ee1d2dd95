"""nblib.publish.show in a real kernel: a sentence shown mid-cell reaches the cell's outputs once."""

import nbformat
from nbclient import NotebookClient

from nblib.core.paths import ROOT


def test_say_displays_wherever_it_is_called_and_once_on_a_last_line():
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("from nblib.publish import show"),
        nbformat.v4.new_code_cell("show.say('first **sentence**')\nx = 1"),  # not the cell's last value
        nbformat.v4.new_code_cell("show.say('second')"),  # the cell's last value
    ]
    NotebookClient(nb, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    shown = [
        [o["data"] for o in cell.outputs if o["output_type"] in ("display_data", "execute_result")]
        for cell in nb.cells[1:]
    ]
    assert shown == [
        [{"text/markdown": "first **sentence**", "text/plain": "<IPython.core.display.Markdown object>"}],
        [{"text/markdown": "second", "text/plain": "<IPython.core.display.Markdown object>"}],
    ]
