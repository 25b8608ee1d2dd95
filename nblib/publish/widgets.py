"""ipywidgets controls for live sessions. Callbacks stay thin over the plain functions that batch
runs call, because papermill never sees an error raised inside a widget callback."""

from nblib.engine.model import INDEX_DTYPES, OVERLAPS
from nblib.engine.runner import MODES
from nblib.publish import show
from nblib.studies import reproduce


def matrix_explorer(dev, model, buckets, workload):
    import ipywidgets as W
    from IPython.display import display

    dtype = W.Dropdown(options=INDEX_DTYPES, description="index dtype")
    mode = W.Dropdown(options=MODES, description="mode")
    overlap = W.Dropdown(options=OVERLAPS, description="overlap")
    bucket = W.Dropdown(options=buckets, value=max(buckets), description="bucket")
    go, out = W.Button(description="run"), W.Output()

    def on_click(_):
        with out:
            out.clear_output()
            rows, aliases = reproduce.corruption_matrix(
                dev,
                model,
                [b for b in buckets if b <= bucket.value],
                workload,
                [dtype.value],
                [mode.value],
                [overlap.value],
            )
            display(show.table(reproduce.with_intervals([r for r in rows if r["bucket"] == bucket.value])))
            display(show.table(aliases))

    go.on_click(on_click)
    display(W.HBox([dtype, mode, overlap, bucket, go]), out)
