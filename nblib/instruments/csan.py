"""PyTorch's CUDA sanitizer (torch.cuda._sanitizer, "CSAN") on the same captures, for comparison.

    r = csan.sanitize(model, buckets, index_dtype="bf16", overlap="on", logits_policy="transient")
    r["errors"], r["raised_at"], r["control"]

CSAN keeps each tensor's accesses from its allocation to its free and drops them at the free. The
race here goes through a freed block: the side stream still writes the logits after the main stream
freed them and handed the bytes to the MLP. To CSAN the MLP's tensor is a new tensor with no
history, so it has nothing to compare. The positive control is its own documentation example,
an unsynchronised write on a second stream, so a silent CSAN in the capture is not a broken CSAN.

CSAN installs process-wide hooks that cannot be removed, so it runs in a child process; it raises
at the first racing kernel, which ends that capture.
"""

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from nblib.backends import device
from nblib.core.paths import ROOT
from nblib.engine.model import weights_kept_in

__all__ = ["compare", "describe", "kernels", "row", "sanitize"]


def sanitize(
    model: Mapping[str, Any],
    buckets: Iterable[int],
    index_dtype: str = "bf16",
    overlap: str = "on",
    logits_policy: str = "transient",
    timeout: float = 600,
) -> dict[str, Any]:
    """Capture every bucket of one configuration with CSAN enabled, in a child process that must
    answer within `timeout` seconds."""
    device.get("cuda")  # no GPU: one line now, not a child's traceback
    spec = dict(
        model=model,
        buckets=list(buckets),
        index_dtype=index_dtype,
        overlap=overlap,
        logits_policy=logits_policy,
        weights=str(weights_kept_in() or "") or None,  # the run folder's drawn set
    )
    root = str(ROOT)
    env = {
        k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"
    }  # real kernels, not the interpreter
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    try:
        p = subprocess.run(
            [sys.executable, "-m", "nblib.instruments.csan", json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=root,
            env=env,
            check=False,  # a failed child is reported below, with its stderr
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(
            f"the CSAN child process ran past {timeout} s ({logits_policy}, buckets {list(buckets)}): "
            "give it fewer or smaller buckets, or a longer timeout"
        ) from None
    lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
    if not lines:
        raise RuntimeError(f"the CSAN child process failed (exit {p.returncode}): {p.stderr.strip()[-3000:]}")
    r = json.loads(lines[-1])
    return r


def compare(
    model: Mapping[str, Any],
    buckets: Collection[int],
    policies: Sequence[str] = ("transient", "record_stream", "persistent"),
    index_dtype: str = "bf16",
    timeout: float = 600,
) -> list[dict[str, Any]]:
    """CSAN on the buggy configuration and on the two fixes (overlap on), one child process each,
    each within `timeout` seconds. The children run side by side: CSAN's verdict is about which
    accesses are synchronised, not about timing, and each child spends most of its time starting."""
    with ThreadPoolExecutor(max(len(policies), 1)) as pool:
        return list(pool.map(lambda p: sanitize(model, buckets, index_dtype, "on", p, timeout), policies))


_GIST = re.compile(r"data race on tensor|[Aa]ccess by stream|during kernel|writing to|reading from")


def _errors(e):
    """Each CSAN error: its kind, its gist (the racing kernels and arguments) and its full text."""
    out = []
    for x in getattr(e, "errors", []):
        text = str(x)
        gist = [ln.strip() for ln in text.splitlines() if _GIST.search(ln)][:6]
        out.append(dict(kind=type(x).__name__, gist=gist, text=text[:4000]))
    return out


def _control():
    """CSAN's documentation example: a tensor written on a new stream without a sync. It must report."""
    # the child's imports stay in the child: CSAN installs process-wide hooks once imported and enabled
    import torch

    # private module: CSAN's error class has no public name (tests/test_private_api.py)
    from torch.cuda._sanitizer import CUDASanitizerErrors

    a = torch.rand(4, 2, device="cuda")
    try:
        with torch.cuda.stream(torch.cuda.Stream()):
            torch.mul(a, 5, out=a)
    except CUDASanitizerErrors as e:
        return dict(reported=True, errors=len(e.errors))
    return dict(reported=False, errors=0)


def _child(spec):
    # the child's imports stay in the child (see _control)
    import torch

    # private module (tests/test_private_api.py): TORCH_CUDA_SANITIZER=1, the public switch, enables
    # the same sanitizer at `import torch`, but its error class has no public name
    from torch.cuda._sanitizer import CUDASanitizerErrors, enable_cuda_sanitizer

    from nblib.engine.model import DecodeModel, ModelConfig, keep_weights_in
    from nblib.engine.runner import Runner

    keep_weights_in(spec.pop("weights", None))
    enable_cuda_sanitizer()
    out = dict(spec, errors=[], raised_at=None, captured=[], control=_control())
    torch.cuda.synchronize()
    dev = device.get("cuda")
    m = DecodeModel(
        ModelConfig(
            **spec["model"],
            index_dtype=spec["index_dtype"],
            overlap=spec["overlap"],
            logits_policy=spec["logits_policy"],
        ),
        dev,
    )
    t0 = time.perf_counter()

    @contextlib.contextmanager
    def note(bucket):
        yield
        out["captured"].append(bucket)

    try:
        Runner(m, spec["buckets"], "graph").capture(record=note)
    except Exception as e:  # CSAN raises inside the capture; capture_end then fails on top of it
        found = e
        while found is not None and not isinstance(found, CUDASanitizerErrors):
            found = found.__context__
        if found is None:
            raise
        out["errors"] = _errors(found)
        out["raised_at"] = f"bucket {m.bucket}" if m.bucket is not None else "warm-up (eager)"
        out["capture_error"] = f"{type(e).__name__}: {str(e).splitlines()[0]}" if e is not found else None
    out["seconds"] = round(time.perf_counter() - t0, 2)
    print(json.dumps(out))


if __name__ == "__main__":
    _child(json.loads(sys.argv[1]))


def kernels(err: Mapping[str, Any]) -> tuple[str, ...]:
    """The two kernels a CSAN error names, e.g. ('csi::indexer_logits_bf16', 'aten::empty.memory_format')."""
    lines = err["text"].splitlines()
    return tuple(
        lines[i + 1].split("(")[0] for i, ln in enumerate(lines[:-1]) if ln.endswith("during kernel:")
    )


def row(r: Mapping[str, Any]) -> dict[str, Any]:
    """A table row for one CSAN run."""
    e = (r.get("errors") or [None])[0]
    return dict(
        logits_policy=r.get("logits_policy"),
        csan="failed to run" if r.get("failed") else "error" if e else "nothing",
        kernels=" vs ".join(kernels(e)) if e else "",
        where=r.get("raised_at") or "",
        captured=r.get("captured"),
        control=(r.get("control") or {}).get("reported"),
    )


def describe(runs: Sequence[Mapping[str, Any]], audit_ok: Mapping[str, bool] | None = None) -> str:
    """One sentence over the CSAN runs (csan.compare), beside the audit's verdicts {policy: ok}."""
    parts = []
    for r in runs:
        x = row(r)
        if x["csan"] == "failed to run":
            parts.append(f"{x['logits_policy']}: CSAN could not be run ({r['failed'][-200:]})")
            continue
        ctl = "" if x["control"] else " (and it missed its own control race, so this means nothing)"
        got = (
            f"error at {x['where']}, {x['kernels']}, which aborted the capture"
            if x["csan"] == "error"
            else f"nothing over buckets {x['captured']}"
        )
        aud = (
            ""
            if audit_ok is None or x["logits_policy"] not in audit_ok
            else f"; the audit: {'no race' if audit_ok[x['logits_policy']] else 'the reuse race'}"
        )
        parts.append(f"{x['logits_policy']}: CSAN {got}{ctl}{aud}")
    seen = {row(r)["csan"] for r in runs}
    head = (
        "CSAN gives the bug and the fixes the same verdict, so it cannot tell them apart"
        if len(seen) == 1
        else "CSAN's verdicts differ between the configurations"
    )
    return f"{head}. " + "; ".join(parts) + "."
