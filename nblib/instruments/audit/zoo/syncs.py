"""The zoo's sync cases on persistent memory: missing and misplaced waits, views, in-place ops."""

from nblib.instruments.audit.zoo.base import RAW, WAR, WAW, N, case, fork, join, zeros


@case("a missing wait (read after write)", RAW)
def missing_wait(dev, racy):
    x, side = zeros(dev, N), dev.Stream()

    def fn():
        main = fork(dev, side)  # forked before the write
        x.fill_(1.0)
        if not racy:
            side.wait_stream(main)
        with dev.stream(side):
            y = x * 2
        main.wait_stream(side)
        return y

    return [fn]


@case("an event recorded too early", RAW)
def event_recorded_too_early(dev, racy):
    x, side, ev = zeros(dev, N), dev.Stream(), dev.Event()

    def fn():
        main = fork(dev, side)
        if racy:
            ev.record(main)
        x.fill_(2.0)
        if not racy:
            ev.record(main)
        side.wait_event(ev)
        with dev.stream(side):
            y = x * 3
        main.wait_stream(side)
        return y

    return [fn]


@case("an event waited on before its last record", RAW)
def stale_event_record(dev, racy):
    x, side, ev = zeros(dev, N), dev.Stream(), dev.Event()

    def fn():
        main = fork(dev, side)
        ev.record(main)  # an earlier record
        if racy:
            side.wait_event(ev)  # waits on that one
        x.fill_(9.0)
        ev.record(main)
        if not racy:
            side.wait_event(ev)
        with dev.stream(side):
            y = x + 1
        main.wait_stream(side)
        return y

    return [fn]


@case("a write after write", WAW)
def write_after_write(dev, racy):
    x, side = zeros(dev, N), dev.Stream()

    def fn():
        main = fork(dev, side)
        with dev.stream(side):
            x.fill_(1.0)
        if not racy:
            main.wait_stream(side)
        x.fill_(2.0)
        main.wait_stream(side)

    return [fn]


@case("a write after read", WAR)
def write_after_read(dev, racy):
    x, side = zeros(dev, N), dev.Stream()

    def fn():
        main = fork(dev, side)
        with dev.stream(side):
            y = x * 2
        if not racy:
            main.wait_stream(side)
        x.fill_(5.0)
        main.wait_stream(side)
        return y

    return [fn]


@case("a sync between the wrong pair of streams", RAW)
def wait_on_wrong_stream(dev, racy):
    x, side, other = zeros(dev, N), dev.Stream(), dev.Stream()

    def fn():
        main = fork(dev, side, other)
        with dev.stream(side):
            x.fill_(1.0)
        (other if racy else main).wait_stream(side)
        y = x * 2
        join(main, side, other)
        return y

    return [fn]


@case("a device-to-device copy", RAW)
def copy_race(dev, racy):
    buf, src, side = zeros(dev, N), zeros(dev, N) + 1, dev.Stream()

    def fn():
        main = fork(dev, side)
        with dev.stream(side):
            buf.copy_(src)
        if not racy:
            main.wait_stream(side)
        y = buf * 2
        main.wait_stream(side)
        return y

    return [fn]


# ------------------------------------------------------------------------------------------------
# views and in-place ops
# ------------------------------------------------------------------------------------------------


@case("overlapping views of one buffer (twin: disjoint views, no sync)", WAW)
def overlapping_views(dev, racy):
    b, side = zeros(dev, 2 * N), dev.Stream()

    def fn():
        main = fork(dev, side)
        lo, hi = (b[: N + 256], b[N - 256 :]) if racy else (b[:N], b[N:])
        with dev.stream(side):
            lo.fill_(1.0)
        hi.fill_(2.0)
        main.wait_stream(side)

    return [fn]


@case("strided views of one buffer (twin: interleaved columns, no sync)", WAW)
def strided_views(dev, racy):
    b, side = zeros(dev, N // 2, 2), dev.Stream()

    def fn():
        main = fork(dev, side)
        with dev.stream(side):
            b[:, 0].fill_(1.0)
        b[:, 0 if racy else 1].fill_(2.0)  # the twin's column interleaves with side's, byte-disjoint
        main.wait_stream(side)

    return [fn]


@case("an in-place op", WAR)
def inplace_op(dev, racy):
    x, side = zeros(dev, N), dev.Stream()

    def fn():
        main = fork(dev, side)
        y = x * 2  # main reads x
        if not racy:
            side.wait_stream(main)
        with dev.stream(side):
            x.add_(1.0)  # side updates it in place
        main.wait_stream(side)
        return y

    return [fn]
