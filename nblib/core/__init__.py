"""core: the bottom layer. Statistics (rates, intervals, tests), atomic file writes, markdown tables
and the provenance a result records (commit, device, versions). Imports no other nblib package."""
