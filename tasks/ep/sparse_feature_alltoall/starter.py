import torch
import torch.distributed as dist


def sparse_feature_alltoall(lengths: torch.Tensor, values: torch.Tensor,
                            feature_owner: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (out_lengths, out_values): for the features this rank owns (feature_owner[f] == rank), in increasing
    feature order, the lengths and ids of every rank's samples, ordered by (source rank, sample index), in the
    same feature-major jagged layout as the inputs (lengths [F * B] and values [sum(lengths)] of this rank)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    # TODO: implement
    raise NotImplementedError
