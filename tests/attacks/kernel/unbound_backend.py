# Class 4 (forbidden APIs by name): calls the forbidden all-reduce through the process group's backend object, an
# unbound base-class method that no tripwire on ProcessGroup or torch.distributed covers. The judge replaces the
# collective methods on every backend class and refuses the c10d dispatcher ops themselves.
import torch
import torch.distributed as dist


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    out = x.clone()
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    base = type(backend).__mro__[-3]  # torch._C._distributed_c10d.Backend
    getattr(base, "allreduce")(backend, [out]).wait()
    return out
