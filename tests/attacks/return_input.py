# Returns its own input unchanged.
import torch


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    return x
