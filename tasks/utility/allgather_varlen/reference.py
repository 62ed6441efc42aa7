import torch
import torch.distributed as dist

# torch >= 2.13 names the single-tensor all-gather all_gather_single; older versions all_gather_into_tensor
if hasattr(dist, "all_gather_single"):
    gather_into = dist.all_gather_single
else:
    gather_into = dist.all_gather_into_tensor


def all_gather_varlen(x: torch.Tensor) -> torch.Tensor:
    """Exchange the lengths, all-gather the inputs padded to the longest one, then drop the padding."""
    world = dist.get_world_size()
    x = x.reshape(-1)
    if world == 1:
        return x.clone()
    lengths = torch.empty(world, dtype=torch.int64, device=x.device)
    gather_into(lengths, torch.tensor([x.numel()], dtype=torch.int64, device=x.device))
    lens = lengths.tolist()
    longest = max(lens)
    if longest == 0:
        return x.new_empty(0)
    if min(lens) == longest:  # equal lengths: gather straight into the result
        out = x.new_empty(world * longest)
        gather_into(out, x.contiguous())
        return out
    padded = x.new_empty(longest)
    padded[:x.numel()].copy_(x)
    gathered = x.new_empty(world * longest)
    gather_into(gathered, padded)
    gathered = gathered.view(world, longest)
    out = x.new_empty(sum(lens))
    torch.cat([gathered[r, :n] for r, n in enumerate(lens)], out=out)
    return out
