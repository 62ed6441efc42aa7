import torch
import torch.distributed as dist


def gather_ghosts(values: torch.Tensor, owner: torch.Tensor, indptr: torch.Tensor,
                  indices: torch.Tensor) -> torch.Tensor:
    """Return the [g, f] values of every vertex owned by another rank that is a neighbour of a vertex this rank
    owns, in increasing global vertex id. `values` [n_local, f] holds this rank's vertices in increasing id;
    `owner`, `indptr`, `indices` (the graph in CSR form) are the same on every rank."""
    rank, world = dist.get_rank(), dist.get_world_size()
    # TODO: implement
    raise NotImplementedError
