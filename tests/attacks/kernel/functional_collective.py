# Class 4 (forbidden APIs by name): the forbidden all-reduce through torch's functional collectives, a package the
# card's forbidden names do not list. It ends in the c10d dispatcher op, which the judge refuses.
import importlib

import torch
import torch.distributed as dist


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    fc = importlib.import_module("torch.distributed._functional_collectives")
    out = fc.all_reduce(x.clone(), "sum", dist.group.WORLD)
    return fc.wait_tensor(out) if hasattr(fc, "wait_tensor") else out
