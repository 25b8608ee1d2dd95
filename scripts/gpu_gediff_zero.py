"""Does the differential see zero divergence where nothing races? With the persistent logits buffer
(no race), bf16 and fp8, overlap off and on, buckets 24 and 48 of params/gpu.yaml: 10 replays of a
full batch each, every one compared with the recompute. Exits 1 on any divergence. Run on the H200
at f8b3327 (outputs/bench/h200-f8b3327/gediff_zero_divergence.log), after the recompute started
filling the GPU.
  python scripts/gpu_gediff_zero.py"""

import sys

from nblib.backends import device
from nblib.engine import build
from nblib.engine.build import full_batch
from nblib.engine.runner import Runner
from nblib.instruments.gediff import GEDiff
from nblib.schema import params as P

if not device.has_cuda():
    sys.exit("gpu_gediff_zero.py: needs a CUDA GPU")
prof = P.load("params/gpu.yaml")
dev = device.get("cuda")
bad = 0
for index_dtype in ("bf16", "fp8"):
    for overlap in ("off", "on"):
        knobs = dict(index_dtype=index_dtype, overlap=overlap, logits_policy="persistent")
        m = build.model(dev, prof["model"], **knobs)
        gd = GEDiff(m)
        runner = Runner(m, [24, 48]).capture()
        for b in (24, 48):
            batch = full_batch(m, b, 0)
            for _ in range(10):
                runner.run(*batch)
                rec = gd.compare(b, b)
                bad += rec["diverged"]
        s = gd.summary()
        print(index_dtype, overlap, s)
        del runner, m, gd
sys.exit(1 if bad else 0)
