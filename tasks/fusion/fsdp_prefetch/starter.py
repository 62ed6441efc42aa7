import torch
import torch.distributed as dist


def fsdp_forward(x: torch.Tensor, weight_shards: list[torch.Tensor], dims: list[int]) -> torch.Tensor:
    """x: [n, dims[0]], this rank's batch. weight_shards[l]: [c_l], this rank's piece of layer l's weight
    [dims[l], dims[l+1]] flattened row-major and zero-padded to world * c_l elements (rank r holds elements
    r*c_l .. (r+1)*c_l - 1). Return h_L [n, dims[-1]]: h_{l+1} = relu(h_l @ W_l), no relu after the last layer."""
    rank, world = dist.get_rank(), dist.get_world_size()
    # TODO: implement
    raise NotImplementedError
