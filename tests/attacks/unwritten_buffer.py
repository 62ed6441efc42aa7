# Returns a freshly allocated buffer that nobody wrote.
import torch


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)
