"""nblib.run.notebook: a notebook's setup freezes what lives for good, once, and keeps no garbage."""

import subprocess
import sys

from nblib.core.paths import ROOT


def test_setup_freezes_what_lives_for_good_once_and_keeps_no_garbage(tmp_path):
    """In a fresh process: a cycle dropped before setup is collected, not frozen; what lives is
    frozen (out of each later collection's traversal); a cycle made after setup is still collected."""
    code = """
import gc, sys, weakref
from nblib.run import notebook
from nblib.schema import params as P

class Node:
    pass

before = Node(); before.me = before; dead = weakref.ref(before); del before
ns = {k: P.default(k) for k in P.DECLARES["05_report"]}
ns.update(backend="sim", output_dir=sys.argv[1])
notebook.setup("05_report", ns)
frozen = gc.get_freeze_count()
after = Node(); after.me = after; later = weakref.ref(after); del after
gc.collect()
notebook.setup("05_report", ns)
print(dead() is None, frozen > 100_000, later() is None, gc.get_freeze_count() <= frozen)  # once: no growth
"""
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.splitlines()[-1] == "True True True True"
