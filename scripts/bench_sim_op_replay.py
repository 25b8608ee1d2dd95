"""The simulator's replay of the project's ops (csi::*) with and without their shortcut: the
custom op's CPU function called directly (nblib.backends.sim.fastops.SHORTCUTS, from
kernels.ops.OpRoles.cpu) against the op through torch's dispatcher. The protocol on the sim
profile (bf16 and fp8, overlap on, its first seeds), captured and run each way in turn, round
after round, in one process; each run's CPU seconds and its corrupted sessions, which must agree.

    python scripts/bench_sim_op_replay.py [--rounds 3] [--seeds 2]
"""

import argparse
import statistics
import time

from kernels.ops import OP_ROLES
from nblib.backends import device
from nblib.backends.sim import fastops
from nblib.engine import build
from nblib.engine.runner import Runner
from nblib.schema import params as P
from nblib.studies import protocol

SHORT = {r.overload(): r.cpu for r in OP_ROLES}


def run(prof, dev, seeds, shortcut):
    """CPU seconds of the protocol in both dtypes, and the corrupted sessions of each."""
    for op, fn in SHORT.items():
        if shortcut:
            fastops.SHORTCUTS[op] = fn
        else:
            fastops.SHORTCUTS.pop(op, None)
    t0, counts = time.process_time(), []
    for dtype in ("bf16", "fp8"):
        m = build.model(dev, prof["model"], index_dtype=dtype, overlap="on")
        runner = Runner(m, prof["buckets"]).capture()
        seed_list = protocol.seeds(prof["seed"], seeds)
        pooled = protocol.run(runner, prof["workload"], seed_list, progress=None).pooled
        counts.append((pooled.corrupted_sessions, pooled.sessions))
    return time.process_time() - t0, counts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seeds", type=int, default=2)
    a = ap.parse_args()
    prof, dev = P.load(P.ROOT / "params" / "sim.yaml"), device.get("sim")
    secs = {True: [], False: []}
    want = None
    for r in range(a.rounds):
        for shortcut in (True, False):
            s, counts = run(prof, dev, a.seeds, shortcut)
            want = want or counts
            assert counts == want, (shortcut, counts, want)
            secs[shortcut].append(s)
            print(f"round {r}: {'shortcut' if shortcut else 'dispatcher'} {s:.2f} s CPU, sessions {counts}")
    on, off = statistics.median(secs[True]), statistics.median(secs[False])
    print(f"median CPU s: shortcut {on:.2f}, dispatcher {off:.2f}, ratio {on / off:.3f}")


if __name__ == "__main__":
    main()
