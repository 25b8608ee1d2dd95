"""The tests' tiny model configurations and workloads (a helper module, not a test file): one base,
TINY, and the variants the tests use, named by what they are for. The values are the ones those
tests assert against (page counts and ffn sizes decide, for instance, which bytes the allocator
hands on), so a variant changes only the keys it names."""

# The audit's and the graphed canary's model: 64 pages, the race's shape in small.
TINY = dict(heads=4, dim=32, topk=16, max_ctx=1024, d_model=256, ffn=1024, num_pages=64, vocab=512)

# The canary's and the differential's model on the simulator: room for the workload's sessions.
CANARY = dict(TINY, num_pages=300)

# The decode model end to end on the simulator (its seeded batches draw from 256 pages).
SIM = dict(TINY, ffn=512, num_pages=256)

# The capture shaped like the H200's graph: a two-layer trunk, one indexer program.
GRAPH = dict(TINY, trunk_layers=2, trunk_width=256, indexer_programs=1)

# The eager CPU model of the conftest's tiny_model fixture (the workload and reference tests).
EAGER = dict(TINY, dim=128, topk=32, num_pages=256)

# The differential's designs and the protocol's statistics: longer contexts.
DIFFERENTIAL = dict(TINY, dim=128, max_ctx=4096, num_pages=300)

# Phase timing and the speed table: the smallest model that still runs every phase.
PHASES = dict(
    heads=2,
    dim=64,
    topk=8,
    max_ctx=512,
    d_model=64,
    ffn=256,
    num_pages=64,
    vocab=64,
    trunk_layers=1,
    trunk_width=64,
    indexer_programs=1,
)

# A short agentic workload for CANARY (build.bucket_run's keys).
CANARY_WORKLOAD = dict(
    sessions=6, rounds=2, ctx_min=64, ctx_max=600, turn_ctx=64, out_min=4, out_max=9, think_min=1, think_max=3
)
