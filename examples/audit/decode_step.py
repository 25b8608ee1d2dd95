"""A decode step with a side-stream overlap, as capture-audit targets: the race and its three fixes.

    python -m nblib audit examples/audit/decode_step.py:racy               # exit 1: a hazard
    python -m nblib audit examples/audit/decode_step.py:join_before_free   # exit 0
    python -m nblib audit examples/audit/decode_step.py:record_stream      # exit 0
    python -m nblib audit examples/audit/decode_step.py:persistent_buffer  # exit 0
    python -m nblib audit examples/audit/decode_step.py:host_sync          # exit 2: rule "sync"
    python -m nblib audit examples/audit/decode_step.py:plain_cuda --backend cuda   # torch.cuda as is

The step: h = x @ w_in on the main stream; a side stream reads h (an indexer-like branch) while
main goes on with an MLP; the side branch's result is added after the join. The race: the last
reference to h is dropped before main waits on the side stream, so the caching allocator may hand
h's bytes to the MLP's tensors while the side stream still reads them.

Each target takes the device facade `dev` (nblib.backends.device) and returns the step, warmed up:
the same code runs on the CPU simulator and on CUDA. `plain_cuda` takes nothing and is written with
torch.cuda directly, as engine code usually is: it runs on CUDA only.
"""

import torch

TOKENS, D, FFN = 8, 256, 1024


class DecodeStep:
    def __init__(self, dev, fix=None):
        g = torch.Generator().manual_seed(0)

        def weight(*shape):
            return (torch.randn(*shape, generator=g) * shape[0] ** -0.5).to(dev.torch_device)

        self.dev, self.fix = dev, fix
        self.w_in, self.w_side = weight(D, D), weight(D, D)
        self.w_up, self.w_down = weight(D, FFN), weight(FFN, D)
        self.x = weight(TOKENS, D)  # the static input a runner fills before each replay
        self.side_out = torch.zeros(TOKENS, D, device=dev.torch_device)
        self.out = torch.zeros(TOKENS, D, device=dev.torch_device)
        # fix 3: h lives in a buffer made once, outside the graph's pool; no free, no reuse
        self.h_buf = torch.empty(TOKENS, D, device=dev.torch_device) if fix == "persistent_buffer" else None
        self.side = dev.Stream()

    def __call__(self):
        dev = self.dev
        main = dev.current_stream()
        if self.h_buf is not None:
            h = torch.matmul(self.x, self.w_in, out=self.h_buf)
        else:
            h = self.x @ self.w_in  # allocated on main
        self.side.wait_stream(main)
        with dev.stream(self.side):
            self.side_out.copy_(torch.relu(h @ self.w_side))  # the side stream reads h
        if self.fix == "join_before_free":  # fix 1: main waits for the reader before the free
            main.wait_stream(self.side)
        if self.fix == "record_stream":  # fix 2: the allocator holds h's block for the side stream
            dev.record_stream(h, self.side)
        del h  # the last reference: h's block goes back to main's free list
        up = torch.relu(self.x @ self.w_up)  # main's next tensors may get h's bytes
        down = up @ self.w_down
        main.wait_stream(self.side)
        self.out.copy_(down + self.side_out)
        return self.out


def _warm(dev, step):
    step()  # eagerly, once: lazy initialisations happen here, not inside the capture
    dev.synchronize()
    return step


def racy(dev):
    return _warm(dev, DecodeStep(dev))


def join_before_free(dev):
    return _warm(dev, DecodeStep(dev, "join_before_free"))


def record_stream(dev):
    return _warm(dev, DecodeStep(dev, "record_stream"))


def persistent_buffer(dev):
    return _warm(dev, DecodeStep(dev, "persistent_buffer"))


def host_sync(dev):
    """A data-dependent branch inside the step: a host synchronisation, which capture forbids."""
    step = DecodeStep(dev, "join_before_free")

    def branchy():
        out = step()
        if out.sum() > 0:  # .item() on a device tensor while capturing
            out.mul_(0.5)
        return out

    return branchy


def plain_cuda():
    """The racy step in plain torch.cuda code (no facade): audit it with --backend cuda."""
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(0)
    w_in, w_side, w_up = (torch.randn(D, n, generator=g).to(dev) * D**-0.5 for n in (D, D, FFN))
    x, side_out = torch.randn(TOKENS, D, generator=g).to(dev), torch.zeros(TOKENS, D, device=dev)
    side = torch.cuda.Stream()

    def step():
        main = torch.cuda.current_stream()
        h = x @ w_in
        side.wait_stream(main)
        with torch.cuda.stream(side):
            side_out.copy_(torch.relu(h @ w_side))
        del h
        up = torch.relu(x @ w_up)
        main.wait_stream(side)
        return up[:, :D] + side_out

    step()
    torch.cuda.synchronize()
    return step
