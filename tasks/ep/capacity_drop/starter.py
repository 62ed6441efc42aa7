from typing import Callable

import torch
import torch.distributed as dist


def moe_forward(tokens: torch.Tensor, expert_ids: torch.Tensor,
                expert_fn: Callable[[int, torch.Tensor], torch.Tensor], experts_per_rank: int,
                capacity: int) -> torch.Tensor:
    """Send every kept token to the rank owning its expert (expert e lives on rank e // experts_per_rank as local
    expert e % experts_per_rank), apply expert_fn there to exactly the kept tokens of each local expert, bring the
    results back and return them as a [T, d] tensor in the original token order, with zero rows for dropped tokens.
    Expert e keeps the first `capacity` tokens routed to it in the order (source rank, token index)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    # TODO: implement
    raise NotImplementedError
