"""The setup cell every notebook opens with, as one call:

    dev, res = nblib.setup("00_reproduce", globals())

It reads the notebook's declared parameters (nblib.schema.params.DECLARES) from the namespace the
parameters cell filled, validates them against the profile schema (one-line error before anything
heavy), opens the device, seeds it, and starts results.json with the parameters actually applied.
"""

import functools
import gc
from pathlib import Path
from typing import NamedTuple

from kernels import launch
from nblib.backends import device
from nblib.core import phases
from nblib.core.results import Results
from nblib.engine import references
from nblib.engine.model import keep_weights_in
from nblib.schema import params, results


class Setup(NamedTuple):
    dev: object  # nblib.backends.device: cuda or sim
    res: Results  # this notebook's results.json


def setup(notebook, namespace, fixed=None):
    """Validate, open the device, seed it, start results.json. fixed: what this notebook runs
    whatever the profile lists (e.g. bf16 only), recorded beside the parameters."""
    if notebook not in params.DECLARES:
        raise ValueError(f"unknown notebook {notebook!r}: choose one of {', '.join(params.DECLARES)}")
    keys = params.DECLARES[notebook]
    missing = [k for k in keys if k not in namespace]
    if missing:
        raise ValueError(f"notebook {notebook} lacks parameter {missing[0]!r}: run its parameters cell first")
    applied = params.validate({k: namespace[k] for k in keys}, f"notebook {notebook}", keys)
    clock = phases.start()  # results.json records where the notebook's time went (Results.finish)
    with clock.phase("setup"):
        dev = device.get(applied["backend"])
        _freeze_what_lives_for_good()
    # phases end with a device synchronize (CUDA queues work), never inside a capture
    clock.sync, clock.capturing = dev.synchronize, dev.is_current_stream_capturing
    if "seed" in applied:
        dev.manual_seed(applied["seed"])  # the simulator's replay timing; CUDA's RNG
    dropped = _drop_unsupported_dtypes(dev, applied, namespace)
    # the run folder's notebooks share their eager reference steps (the suite's 01-04 decode the
    # workloads 00 decoded), kept by the source that computed them
    store = Path(applied["output_dir"]) / ".references" / references.source_digest()
    references.shared().attach(store)
    keep_weights_in(store)  # and their weights, drawn once (the draw costs seconds on the H200)
    res = Results(notebook, applied["output_dir"], dev, applied, fixed, check=results.validate)
    if dropped:
        res["dropped"] = dropped
    print({k: res[k] for k in ("backend", "device", "torch", "triton", "commit")})
    return Setup(dev, res)


@functools.cache  # once a process
def _freeze_what_lives_for_good():
    """Once a process: what the imports and the device made lives as long as the kernel, so it goes
    out of the cyclic collector's sight (gc.freeze), after a collection so no garbage is kept. The
    studies collect between configurations (a graph's pool must be free before the next capture),
    and each collection then traverses only what the notebook made since: about 225K objects fewer
    on the simulator, 1.6x faster a collection."""
    gc.collect()
    gc.freeze()


def _drop_unsupported_dtypes(dev, applied, namespace):
    """Leave out of index_dtypes (applied, and the notebook's own variable) what this GPU's kernels
    cannot run: fp8 below compute capability 8.9 (kernels.launch.supports). Returns the record
    results.json keeps ({} where nothing was left out; always on the simulator)."""
    listed = applied.get("index_dtypes")
    if dev.name != "cuda" or not listed:
        return {}
    arch = launch.arch_of(dev.torch_device)
    out = [d for d in listed if not launch.supports(d, arch)]
    if not out:
        return {}
    kept = [d for d in listed if d not in out]
    why = f"{dev.device_name()} (sm_{arch}) has no {'/'.join(out)} tensor cores"
    if not kept:
        raise ValueError(f"index_dtypes {listed}: {why}; list bf16 in the profile")
    applied["index_dtypes"] = namespace["index_dtypes"] = kept
    return dict(index_dtypes=out, reason=why)
