import torch
import torch.distributed as dist


def vocab_parallel_embedding(ids: torch.Tensor, table_shard: torch.Tensor, vocab_bounds: list[int],
                             seq_lens: list[int]) -> torch.Tensor:
    """ids: [seq_lens[rank]] int64 in [0, V), this rank's tokens; table_shard: [V_r, d], rows
    vocab_bounds[rank] .. vocab_bounds[rank + 1] - 1 of the embedding table. Return [seq_lens[rank], d] with row i
    = table row ids[i] (an exact copy), whichever rank holds it."""
    rank, world = dist.get_rank(), dist.get_world_size()
    # TODO: implement
    raise NotImplementedError
