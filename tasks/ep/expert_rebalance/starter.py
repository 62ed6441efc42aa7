import torch
import torch.distributed as dist


def rebalance(weights: torch.Tensor, old_placement: torch.Tensor, new_placement: torch.Tensor) -> torch.Tensor:
    """weights[j] belongs to expert old_placement[rank, j]. Return a tensor like `weights` whose slot j holds
    the weights of expert new_placement[rank, j], fetching them point to point from the ranks that hold them."""
    rank, world = dist.get_rank(), dist.get_world_size()
    # TODO: implement
    raise NotImplementedError
