"""Record the CUDA caching allocator's alloc/free sequence while capturing every bucket of the
model, with the addresses it returned: test data for the simulator's allocator (tests/data/).
Usage: python scripts/alloc_trace.py OUT.json [ffn]"""

import contextlib
import sys

import torch

from nblib.backends import device
from nblib.core.files import write_json
from nblib.engine.model import DecodeModel, ModelConfig
from nblib.engine.runner import Runner

dev = device.get("cuda")
ffn = int(sys.argv[2]) if len(sys.argv) > 2 else 32768
events = []
names = {}


@contextlib.contextmanager
def record(bucket):
    # private, no public API records the trace (tests/test_private_api.py checks both names)
    torch.cuda.memory._record_memory_history("all", stacks="python")
    try:
        yield
    finally:
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(None)
        for dt in snap["device_traces"]:
            for e in dt:
                if e["action"] in ("alloc", "free_requested", "free_completed", "segment_alloc"):
                    frames = [
                        f"{f['filename'].split('/')[-1]}:{f['line']}:{f['name']}"
                        for f in e.get("frames", [])
                        if "nblib" in f["filename"] or "kernels" in f["filename"]
                    ][:3]
                    events.append(
                        dict(
                            bucket=bucket,
                            action=e["action"],
                            addr=e["addr"],
                            size=e["size"],
                            stream=names.setdefault(e["stream"], f"s{len(names)}"),
                            frames=frames,
                        )
                    )


m = DecodeModel(ModelConfig(ffn=ffn, num_pages=2048), dev)
r = Runner(m, [1, 2, 4, 8, 16, 32, 64], "graph").capture(record=record)
write_json(
    sys.argv[1],
    dict(device=dev.device_name(), torch=torch.__version__, ffn=ffn, aliases=r.aliases(), events=events),
)
print(len(events), "events;", "aliases:", [(a["bucket"], a["first"], a["second"]) for a in r.aliases()])
