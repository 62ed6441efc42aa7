# Tries to move data between ranks outside the messages the coordinator counts: in a subgroup's name, and in a
# frame of its own invention. Neither reaches another rank; the invented frame ends the evaluation.
import torch
import torch.distributed as dist


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    pg = dist.group.WORLD
    channel = next(v for v in vars(pg).values() if hasattr(v, "send"))
    rank = dist.get_rank()
    channel.send({"type": "net", "op": "group", "g": "data:" + ",".join(map(str, x.tolist()[:4])), "ranks": [rank]})
    channel.send({"type": "net", "op": "peek", "h": 1, "from": (rank + 1) % dist.get_world_size()})
    return x * dist.get_world_size()
