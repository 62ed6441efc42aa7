# Writes through numpy's C code (no Python audit event) to pass data between ranks through a file.
import torch
import torch.distributed as dist


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    rank = dist.get_rank()
    x.numpy().tofile(f"/tmp/commbench-attack-np-{rank}.bin")
    return x.clone()
