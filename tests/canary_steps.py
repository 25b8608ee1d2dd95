"""Random decode steps for the canary's tests (a helper module, not a test file): rows on distinct
pages with stale page ids past each row's range, and the host's definitions of the pages a step
makes live, expected and always watched."""

import torch

from nblib.engine.model import PAGE
from nblib.instruments import canary
from nblib.instruments.canary import SCRATCH_PAGE

P, WIDTH = 400, 16  # cache pages; page-table columns


def random_step(seed, live_pages=False, bs=None):
    """A step as run_sessions or build.full_batch hands it: rows on distinct pages, columns past a
    row's live range holding stale page ids (which must not count as live), stores in a row's last
    page or the scratch slot; live_pages (optional) a wider set, as run_sessions passes it."""
    g = torch.Generator().manual_seed(seed)
    bs = bs or int(torch.randint(1, 12, (1,), generator=g))
    lens = torch.randint(1, WIDTH * PAGE + 1, (bs,), generator=g, dtype=torch.int32)
    lens[0] = PAGE * int(torch.randint(1, WIDTH + 1, (1,), generator=g))  # a whole number of pages
    need = ((lens + PAGE - 1) // PAGE).tolist()
    pool = (torch.randperm(P - 1, generator=g) + 1).int()
    table = torch.randint(1, P, (bs, WIDTH), generator=g, dtype=torch.int32)  # stale ids past the range
    at = 0
    for r, n in enumerate(need):
        table[r, :n] = pool[at : at + n]
        at += n
    last = table[torch.arange(bs), (lens - 1).long() // PAGE].long()
    stores = last * PAGE + (lens - 1).long() % PAGE
    stores[torch.rand(bs, generator=g) < 0.3] = PAGE - 1  # rows with nothing to store: scratch slot
    step = dict(index=seed, bs=bs, bucket=bs, tokens=torch.zeros(bs, dtype=torch.long))
    step.update(page_table=table, seq_lens=lens, store_slots=stores)
    if live_pages:
        extra = pool[at : at + int(torch.randint(0, 60, (1,), generator=g))].tolist()
        step["live_pages"] = canary.batch_live_pages(table, lens) | set(extra)
    return step


def host_sets(step):
    """The old definitions: live, expected and the pages always watched."""
    live = set(canary._live(step))
    expected = canary.expected_pages(step["store_slots"])
    return live, expected, live | expected | {SCRATCH_PAGE}


def pick(xs, n, g):
    """n of xs at random (all when fewer)."""
    return [xs[i] for i in torch.randperm(len(xs), generator=g)[:n].tolist()]
