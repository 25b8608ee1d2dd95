"""The zoo's allocator-reuse cases: a block freed before its last user on another stream is done."""

import torch

from nblib.instruments.audit.zoo.base import WAR, WAW, N, case, empty, fork, join, zeros


@case("allocator reuse after a free before the join", WAR)
def reuse_free_before_join(dev, racy):
    x, side = zeros(dev, N), dev.Stream()

    def fn():
        main = fork(dev, side)
        t = x * 2  # allocated on main
        side.wait_stream(main)
        with dev.stream(side):
            r = t + 1  # read on side
        if not racy:
            main.wait_stream(side)
        del t  # freed: racy, before the side stream is joined
        u = empty(dev, N)  # main's next tensor gets t's bytes
        u.fill_(-1.0)
        main.wait_stream(side)
        return r, u

    return [fn]


@case("allocator reuse with record_stream", WAR)
def reuse_record_stream(dev, racy):
    x, side = zeros(dev, N), dev.Stream()

    def fn():
        main = fork(dev, side)
        t = x * 2
        side.wait_stream(main)
        with dev.stream(side):
            r = t + 1
        dev.record_stream(t, main if racy else side)  # racy: names the wrong stream (a no-op)
        del t
        u = empty(dev, N)
        u.fill_(-1.0)
        main.wait_stream(side)
        return r, u

    return [fn]


@case("a tensor allocated on one side stream and freed on another", WAR)
def reuse_across_side_streams(dev, racy):
    x, s1, s2 = zeros(dev, N), dev.Stream(), dev.Stream()

    def fn():
        main = fork(dev, s1, s2)
        with dev.stream(s1):
            t = x * 2  # allocated on s1: its block goes back to s1's free list
        s2.wait_stream(s1)
        with dev.stream(s2):
            r = t + 1
            del t  # the last reference dies on s2
        if not racy:
            s1.wait_stream(s2)
        with dev.stream(s1):
            u = empty(dev, N)  # s1 reuses the block s2 may still read
            u.fill_(-1.0)
        join(main, s1, s2)
        return r, u

    return [fn]


@case("allocator reuse after a partial join", WAR)
def reuse_after_partial_join(dev, racy):
    x, s1, s2 = zeros(dev, N), dev.Stream(), dev.Stream()

    def fn():
        main = fork(dev, s1, s2)
        t = x * 2
        s1.wait_stream(main)
        s2.wait_stream(main)
        with dev.stream(s1):
            r1 = t + 1
        with dev.stream(s2):
            r2 = t * 3
        main.wait_stream(s1)
        if not racy:
            main.wait_stream(s2)
        del t
        u = empty(dev, N)
        u.fill_(0.5)
        main.wait_stream(s2)
        return r1, r2, u

    return [fn]


@case("discarded side-stream intermediates", WAW, WAR)
def discarded_side_intermediate(dev, racy):
    x, side = zeros(dev, N), dev.Stream()

    def fn():
        main = fork(dev, side)
        if racy:
            tmp = empty(dev, N)  # on main, written and read on side
            side.wait_stream(main)
            with dev.stream(side):
                torch.mul(x, 2, out=tmp)
                s = tmp.sum()
        else:
            with dev.stream(side):
                tmp = x * 2  # the side stream's own intermediate
                s = tmp.sum()
        del tmp  # discarded before the join
        u = empty(dev, N)
        u.fill_(-2.0)
        main.wait_stream(side)
        return s, u

    return [fn]


@case("two captures sharing one pool", WAR)
def shared_pool_two_captures(dev, racy):
    x, side = zeros(dev, N), dev.Stream()

    def first():  # leaves freed blocks in the shared pool
        a = x * 2
        b = a + 1
        del a
        return b

    def second():
        main = fork(dev, side)
        t = x * 3  # may get the first capture's freed block
        side.wait_stream(main)
        with dev.stream(side):
            r = t + 1
        if not racy:
            main.wait_stream(side)
        del t
        u = empty(dev, N)
        u.fill_(-3.0)
        main.wait_stream(side)
        return r, u

    return [first, second]
