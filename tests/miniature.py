"""The engine's race in miniature, shared by the simulator's and the audit's tests: a main-stream
transient consumed on the side stream and freed before the join, its bytes handed to the main
stream's next tensor. `fix` removes the race one way or another."""

import torch

N = 4096


def reuse_race_step(dev, side, x, fix=None, lead=0):
    """Call while capturing. Returns (r, the transient's address, u): r is the side stream's
    result, u the main-stream tensor allocated after the free. lead: main-stream ops between the
    free and the write into the reused bytes (the main branch's lead in the race)."""
    main = dev.current_stream()
    side.wait_stream(main)
    if fix == "side_alloc":
        with dev.stream(side):
            t = x * 2
    else:
        t = x * 2  # allocated on main ...
    side.wait_stream(main)
    with dev.stream(side):
        pre = (x + 3).exp()  # ... the side stream is busy first ...
        r = t + pre  # ... then reads t
    if fix == "record_stream":
        dev.record_stream(t, side)
    if fix == "join":
        main.wait_stream(side)
    t_addr = t.data_ptr()
    del t  # ... freed before the join ...
    u = torch.empty(N)  # ... and its bytes go to the main stream's next tensor
    for _ in range(lead):
        x = x.sin()
    u.fill_(-100.0)
    main.wait_stream(side)
    return r, t_addr, u
