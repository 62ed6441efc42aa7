import torch
import torch.distributed as dist


def fsdp_forward(x: torch.Tensor, weight_shards: list[torch.Tensor], dims: list[int]) -> torch.Tensor:
    world = dist.get_world_size()
    layers = len(weight_shards)

    def gather(l: int):
        """Start the all-gather of layer l's weight (async): the padded flat weight, every rank's shard in order."""
        shard = weight_shards[l]
        full = torch.empty(world * shard.numel(), dtype=shard.dtype, device=shard.device)
        return dist.all_gather_into_tensor(full, shard.contiguous(), async_op=True), full

    h = x
    pending = gather(0) if layers else None
    for l in range(layers):
        work, full = pending
        # prefetch: layer l + 1's gather is issued before layer l is waited for and computed, so on a GPU it runs
        # on the communication stream while this layer's matmul runs on the compute stream
        pending = gather(l + 1) if l + 1 < layers else None
        work.wait()
        w = full[:dims[l] * dims[l + 1]].view(dims[l], dims[l + 1])  # drop the padding, no copy
        h = h @ w
        if l < layers - 1:
            h = torch.relu_(h)
        del w, full, work  # the gathered weight is freed as soon as its layer is done: at most two are alive
    return h
