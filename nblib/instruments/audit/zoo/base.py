"""The zoo's building blocks: the Case record and its registry, and small helpers that work on
either backend through the device facade."""

from dataclasses import dataclass

import torch

N = 4096  # floats per tensor: 16 KiB, the allocator's small pool
RAW, WAR, WAW = "read-after-write", "write-after-read", "write-after-write"


@dataclass(frozen=True)
class Case:
    name: str
    covers: str  # which hazard pattern of the zoo's list it plants
    kinds: tuple  # hazard kinds the planted race shows (any one of them is right)
    build: object  # build(dev, racy) -> [fn, ...] to capture in order, into one pool


CASES = []


def case(covers, *kinds):
    def register(build):
        CASES.append(Case(build.__name__, covers, kinds, build))
        return build

    return register


def zeros(dev, *shape):
    return torch.zeros(*shape, device=dev.torch_device)


def empty(dev, *shape):
    return torch.empty(*shape, device=dev.torch_device)


def fork(dev, *streams):
    main = dev.current_stream()
    for s in streams:
        s.wait_stream(main)
    return main


def join(main, *streams):
    for s in streams:
        main.wait_stream(s)
