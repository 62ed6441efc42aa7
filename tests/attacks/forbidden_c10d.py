# Reaches the forbidden collective through the distributed_c10d module and a variable.
import torch
import torch.distributed as dist

c10d = dist.distributed_c10d
fn = c10d.all_reduce


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    fn(y)
    return y
