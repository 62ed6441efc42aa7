# Reaches the forbidden collective through an alias import.
import torch
from torch.distributed import all_reduce as reduce_everything


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    reduce_everything(y)
    return y
