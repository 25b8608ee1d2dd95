"""On a CUDA GPU: what the kernel launchers read from it (SM count, opt-in shared memory per block),
which cache dtypes and logits configs they pick for it, and the logits kernels checked against the
float64 reference with those picks. One JSON object on stdout; exit status 1 if a check fails.

    python scripts/gpu_targets.py        # about a minute, most of it compiling

On an H200 it should read sm_90, 132 SMs and 232448 B from the device (optin_from_device true),
pick K through TMA (bf16 5 stages, fp8 3) and check both dtypes.
"""

import json
import sys

import torch

from kernels import launch, logits_check
from kernels.logits_configs import config_for


def main():
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU: run it where the kernels run")
    dev = torch.device("cuda", torch.cuda.current_device())
    target = launch.target_of(dev)
    props = torch.cuda.get_device_properties(dev)
    kinds = [k for k in ("bf16", "fp8") if launch.supports(k, target.arch)]
    report = dict(
        target=target._asdict(),
        optin_from_device=hasattr(props, "shared_memory_per_block_optin"),
        table=launch.facts(target.arch)._asdict(),
        dtypes=kinds,
        configs={k: config_for(k, target.arch, 64, 128, target.smem_per_block)._asdict() for k in kinds},
    )
    try:
        report["errors"] = [logits_check.check("cuda", **case) for case in logits_check.CHECK_CASES]
        ok = True
    except AssertionError as e:
        report["failure"], ok = str(e), False
    print(json.dumps(report, indent=1))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
