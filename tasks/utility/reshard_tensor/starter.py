import torch
import torch.distributed as dist


def reshard(x: torch.Tensor, src_rows: list[int], grid: tuple[int, int], block: tuple[int, int]) -> torch.Tensor:
    """x holds rows R_r .. R_r + src_rows[r] - 1 of the global matrix (R_r = the sum of the earlier src_rows).
    Return this rank's local array of the block-cyclic layout over the grid (pr, pc) with blocks (br, bc): the rows
    i with (i // br) % pr == rank // pc and the columns j with (j // bc) % pc == rank % pc, both in increasing
    order; a [0, 0] tensor on ranks outside the grid."""
    rank, world = dist.get_rank(), dist.get_world_size()
    # TODO: implement
    raise NotImplementedError
