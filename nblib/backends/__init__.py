"""backends: one device facade with two backends. `cuda` is a thin alias of torch.cuda; `sim` is
a CPU simulator of the caching allocator, streams, events and graph capture/replay, so the same
model code runs and corrupts on any machine. Code outside reaches a backend through the facade
(device.get) only; what both backends share and the audit reads lives beside them: opinfo (what an
op does to memory), storage (a tensor's bytes) and capture_rules (what a capture forbids). May import
nblib.core and kernels only."""
