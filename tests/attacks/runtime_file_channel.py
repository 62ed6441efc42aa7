# Passes data between ranks through files instead of the process group.
import torch
import torch.distributed as dist

DIR = "/tmp"


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.save(x, f"{DIR}/commbench-attack-{rank}.pt")
    total = x.clone()
    for peer in range(world):
        if peer != rank:
            path = f"{DIR}/commbench-attack-{peer}.pt"
            for _ in range(100000):
                try:
                    total += torch.load(path)
                    break
                except (FileNotFoundError, EOFError, RuntimeError):
                    pass
    return total
