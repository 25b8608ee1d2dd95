"""The writer process of the index test (tests/test_runindex.py): a module of its own, so each
spawned writer imports the run index alone, not the test module's torch and studies."""

from nblib.publish import runindex


def write_records(out, names, barrier):
    barrier.wait()  # both writers start together, after their imports
    for n in names:
        rec = dict(notebook=n, status="ok", html=f"{n}.html", error=None, seconds=1.0)
        runindex.record(
            out, dict(rec, verdict=None, backend="sim", device="sim", commit="c"), "params/ci.yaml"
        )
