"""The zoo's many-stream cases: fan-out, fan-in, event chains, streams and events made inside the capture."""

from nblib.instruments.audit.zoo.base import RAW, WAR, WAW, N, case, fork, join, zeros


@case("fan-out over many streams, a join missing", RAW)
def fan_out_join_missing(dev, racy):
    out, streams = zeros(dev, 4, N), [dev.Stream() for _ in range(4)]

    def fn():
        main = fork(dev, *streams)
        for i, s in enumerate(streams):
            with dev.stream(s):
                out[i].fill_(float(i))
        join(main, *(streams[:-1] if racy else streams))
        total = out.sum()
        join(main, *streams)
        return total

    return [fn]


@case("fan-in over many streams, a wait missing (readers' results discarded)", WAR)
def fan_in_partial_wait(dev, racy):
    x = zeros(dev, N)
    readers, writer = [dev.Stream() for _ in range(5)], dev.Stream()
    events = [dev.Event() for _ in readers]

    def fn():
        main = fork(dev, *readers, writer)
        for s, e in zip(readers, events):
            with dev.stream(s):
                x.sum()  # discarded at once
            e.record(s)
        for e in events[:3] if racy else events:
            writer.wait_event(e)
        with dev.stream(writer):
            x.fill_(7.0)
        join(main, *readers, writer)

    return [fn]


@case("an event chain (racy: a link recorded before its wait)", RAW)
def event_chain(dev, racy):
    x, (s1, s2, s3), (e1, e2) = zeros(dev, N), [dev.Stream() for _ in range(3)], [dev.Event(), dev.Event()]

    def fn():
        main = fork(dev, s1, s2, s3)
        with dev.stream(s1):
            x.fill_(3.0)
        e1.record(s1)
        if racy:
            e2.record(s2)
        s2.wait_event(e1)
        if not racy:
            e2.record(s2)
        s3.wait_event(e2)
        with dev.stream(s3):
            y = x * 2
        join(main, s1, s2, s3)
        return y

    return [fn]


@case("a stream created inside the capture", RAW)
def stream_created_in_capture(dev, racy):
    x = zeros(dev, N)

    def fn():
        side = dev.Stream()
        main = fork(dev, side)
        x.fill_(4.0)
        if not racy:
            side.wait_stream(main)
        with dev.stream(side):
            y = x + 1
        main.wait_stream(side)
        return y

    return [fn]


@case("an event created inside the capture, recorded on the wrong stream", RAW)
def event_created_in_capture(dev, racy):
    x, side = zeros(dev, N), dev.Stream()

    def fn():
        ev = dev.Event()
        main = fork(dev, side)
        with dev.stream(side):
            x.fill_(6.0)
        ev.record(main if racy else side)
        main.wait_event(ev)
        y = x * 2
        main.wait_stream(side)
        return y

    return [fn]


@case("a second side stream obtained inside the capture, both forked and joined", WAW)
def two_side_streams(dev, racy):
    x, side1 = zeros(dev, N), dev.Stream()

    def fn():
        side2 = dev.Stream()
        main = fork(dev, side1, side2)
        with dev.stream(side1):
            x.fill_(1.0)
        if not racy:
            side2.wait_stream(side1)
        with dev.stream(side2):
            x.mul_(3.0)
        join(main, side1, side2)

    return [fn]


@case("interleaved halves of a wide tensor, one read on main and one written on a side stream", WAR)
def wide_interleaved_halves(dev, racy):
    # more elements than the audit lists one by one: decided from the views' shared layout
    wide = (1 << 22) + 1
    x = zeros(dev, 2 * wide)
    side = dev.Stream()
    written = slice(0, None, 2) if racy else slice(1, None, 2)  # racy: the elements main reads

    def fn():
        main = fork(dev, side)
        y = x[0::2].neg()  # the even elements, on main
        with dev.stream(side):
            x[written].fill_(2.0)
        main.wait_stream(side)
        return y

    return [fn]
