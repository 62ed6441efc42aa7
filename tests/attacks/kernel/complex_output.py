# Class 11 (crashing the judge): returns an output in a dtype the judge does not decode. It used to raise inside the
# coordinator and end as an unscored infrastructure error; now it is this rank's runtime error.
import torch


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    return torch.zeros(x.shape, dtype=torch.complex64)
