import sys
sys.path.insert(0, "examples/field"); sys.path.insert(0, "scripts")
import field_table
from nblib.backends import device
m = field_table.load_file("examples/field/measure.py", "_m")
for form in ("buggy", "fixed"):
    dev = device.get("cuda")
    spec = f"examples/field/sglang_dsv41_candidate_indexer.py:{form}"
    target = m.audit_target.load(spec)
    step = target.fn(dev)
    dev.memory_history(True)
    start = len(m._trace(dev))
    rep = m.audit_target.audit_step(step, dev, target=spec)
    entries = m._trace(dev)[start:]
    dev.memory_history(False)
    print(form, "peak", m.peak_held(entries), "entries", len(entries))
    for e in entries:
        print("  ", e["action"], e.get("size"), e.get("block_size"), hex(e.get("addr", 0)), e.get("stream"))
