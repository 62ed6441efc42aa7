# Correct and simple: gather every rank's x, then one matmul. No overlap; must pass.
import torch.distributed as dist


def allgather_matmul(x, w):
    world = dist.get_world_size()
    gathered = x.new_empty((world * x.shape[0], x.shape[1]))
    dist.all_gather_into_tensor(gathered, x.contiguous())
    return gathered @ w
