import torch
import torch.distributed as dist


def transfer_kv_blocks(pool: torch.Tensor, table_offsets: torch.Tensor, table_blocks: torch.Tensor,
                       seq_rank: torch.Tensor, cached_blocks: torch.Tensor | None) -> torch.Tensor:
    """Move the KV-cache blocks of every sequence from the prefill rank 0 into the slots its decode rank
    seq_rank[i] lists for it, and return this rank's pool (rank 0's unchanged; a decode rank's with the
    sequence blocks at their slots and every other slot as it was)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    # TODO: implement
    raise NotImplementedError
