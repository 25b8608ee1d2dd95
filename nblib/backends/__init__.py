"""backends: one device facade with two backends. `cuda` is a thin alias of torch.cuda; `sim` is
a CPU simulator of the caching allocator, streams, events and graph capture/replay, so the same
model code runs and corrupts on any machine. May import nblib.core and kernels only."""
