"""instruments: what an investigator attaches to the engine. The canary (page checksums), the
graph-vs-eager differential (gediff), the capture trace recorder and its audit (races from one
capture), PyTorch's CUDA sanitizer on the same captures (csan), and overhead timing. May import
nblib.core, nblib.backends, nblib.engine and kernels; never studies or publish."""
