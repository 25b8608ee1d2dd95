"""TorchRec memory stashing: a storage freed with `resize_(0)` while a side-stream D2H copy still reads it.

    python -m nblib audit examples/field/torchrec_stash_d2h.py:buggy   # exit 1: write-after-read on tensor
    python -m nblib audit examples/field/torchrec_stash_d2h.py:fixed   # exit 0

Repository: meta-pytorch/torchrec. Reference: pull request #4218, "Fix the NaN issue due to the memory
usage race condition over multiple streams" (the fix), and #4231, "Add record_stream benchmark to
reproduce NaN issue in EMS" (the reproducer: torchrec/distributed/benchmark/benchmark_comms.py,
data_copy_record_stream, commit f77e6f06f45e3027d9ca2c5005218f126ccd7d9c). Engine:
torchrec/distributed/memory_stashing.py, MemoryStashingManager's execute_stash (and restore). Buggy:
f3b5a9a6a64e287876cf29f6f4b2af399bd439aa. Fixed: f9799f4ed5040849b53783f14b26572bccdf2c73 (adds
`tensor.record_stream(d2h_stream)` after each copy, and `hbm_ref.record_stream(h2d_stream)` in restore).

The ordering. execute_stash makes the D2H stream wait on the caller's stream, then on the D2H stream
enqueues `cpu_buffer.copy_(tensor, non_blocking=True)` for every tensor and, in a second pass,
`tensor.untyped_storage().resize_(0)`: a host-side free of the HBM block. The block was allocated on the
default stream (FBGEMM's weights_dev), so the allocator considers it reusable at once by the default
stream; the default stream's next allocations (dense forward intermediates, output_dist buffers) take
the bytes and overwrite them while the copy is still reading, the pinned buffer captures garbage, and
the next restore brings it back as NaN. The fix records each tensor on the D2H stream before the free.

Training steps are not captured and the engine's stashed tensors are made outside the step; the target
makes the stashed tensor inside the captured step, as the #4231 reproducer does in eager mode (allocate,
copy on the side stream, `resize_(0)`, then same-shaped `torch.full` allocations on the main stream), so
that one capture shows the reuse. A persistent device buffer stands in for the pinned host buffer: what
races is the D2H stream's read of `tensor`. The simulator refuses `resize_` while capturing, so the free
is written `tensor.data = tensor.new_empty(0)`, which swaps the storage out the same way at the same
host point (the tensor object stays, as after `resize_(0)`).
"""

import _field
import torch

ROWS, DIM, NEW = 64, 64, 2


class Stash:
    def __init__(self, dev, record):
        p = _field.params(dev)
        self.dev, self.record = dev, record
        self.x, self.w = p(ROWS, DIM), p(DIM, DIM)
        self.cpu_buffer = torch.zeros(ROWS, DIM, device=dev.torch_device)  # the pinned host buffer's role
        self.out = torch.zeros(ROWS, DIM, device=dev.torch_device)
        self.d2h_stream = dev.Stream()

    def step(self):
        dev = self.dev
        main = dev.current_stream()
        tensor = self.x @ self.w  # the HBM tensor to stash, allocated on the default stream
        # execute_stash
        self.d2h_stream.wait_stream(main)
        with dev.stream(self.d2h_stream):
            self.cpu_buffer.copy_(tensor, non_blocking=True)
            if self.record:
                dev.record_stream(tensor, self.d2h_stream)  # the block waits for the copy
            tensor.data = tensor.new_empty(0)  # untyped_storage().resize_(0): frees the HBM block
        # the default stream goes on: same-shaped allocations, as in the reproducer
        acc = torch.zeros(ROWS, DIM, device=dev.torch_device)
        for _ in range(NEW):
            acc += torch.full((ROWS, DIM), -1.0, device=dev.torch_device) @ self.w
        self.out.copy_(acc)
        main.wait_stream(self.d2h_stream)  # await_restore: the caller joins the copy before the restore
        return self.out


def buggy(dev):
    """execute_stash before #4218: resize_(0) with the copy in flight and no record_stream."""
    return _field.warm(dev, Stash(dev, record=False).step)


def fixed(dev):
    """execute_stash after #4218: the tensor is recorded on the D2H stream before the free."""
    return _field.warm(dev, Stash(dev, record=True).step)
