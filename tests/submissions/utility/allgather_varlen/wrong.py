# WRONG: exchanges the lengths and pads to the longest, but returns the padded gather as is: the zero padding
# of the shorter ranks is never stripped (so the result has world * max_len elements).
import torch
import torch.distributed as dist


def all_gather_varlen(x: torch.Tensor) -> torch.Tensor:
    world = dist.get_world_size()
    lengths = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(lengths, torch.tensor([x.numel()], dtype=torch.int64))
    longest = int(max(int(n) for n in lengths))
    padded = torch.zeros(longest, dtype=x.dtype)
    padded[:x.numel()] = x
    parts = [torch.empty(longest, dtype=x.dtype) for _ in range(world)]
    dist.all_gather(parts, padded)
    return torch.cat(parts)
