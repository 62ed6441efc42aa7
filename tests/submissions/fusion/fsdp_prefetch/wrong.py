# Plausible bug: the flat weight is read as torch.nn.Linear stores it, [out, in], and applied transposed.
# The gathering and the prefetch are right; every layer multiplies by the wrong matrix.
import torch
import torch.distributed as dist


def fsdp_forward(x, weight_shards, dims):
    world = dist.get_world_size()
    layers = len(weight_shards)

    def gather(l):
        full = torch.empty(world * weight_shards[l].numel(), dtype=weight_shards[l].dtype)
        return dist.all_gather_into_tensor(full, weight_shards[l], async_op=True), full

    h = x
    pending = gather(0)
    for l in range(layers):
        work, full = pending
        pending = gather(l + 1) if l + 1 < layers else None
        work.wait()
        w = full[:dims[l] * dims[l + 1]].view(dims[l + 1], dims[l]).t()  # BUG: W_l is [dims[l], dims[l+1]]
        h = h @ w
        if l < layers - 1:
            h = torch.relu(h)
    return h
