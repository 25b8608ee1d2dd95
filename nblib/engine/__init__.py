"""engine: the miniature DeepSeek-V4-style decode path under study. The model (compressor,
indexer on a side stream while capturing, top-k, sparse attention, main-branch layers), the
graph runner (buckets captured into one shared pool), the agentic workload under continuous
batching, and persistent buffers (the fix). May import nblib.core, nblib.backends and kernels."""
