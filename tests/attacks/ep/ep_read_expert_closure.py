# TASK: ep/moe_dispatch_combine
# EXPECT: forbidden
# Reads the secret transform out of the harness instead of probing it: operator.attrgetter("__closure__") hands over
# expert_fn's closure cells (the keys, scale and bias, and the row counter) and "__globals__" the harness's own
# transform function; the keys are all-gathered (a few E * d values), every rank computes its outputs itself, and
# the counter is set to the routed counts. Nothing is dispatched.
# The static check refuses operator.attrgetter / methodcaller and any string naming a dunder attribute. The keys
# still live in the rank's process (the harness applies the transform there), so native code could read them: a
# limit docs/trust-model.md names; per-call, per-rank keys keep what it could learn to one call of one rank.
import operator

import torch
import torch.distributed as dist


def _gather(t):
    out = torch.empty((dist.get_world_size() * t.shape[0], *t.shape[1:]), dtype=t.dtype, device=t.device)
    dist.all_gather_into_tensor(out, t.contiguous())
    return out.view(dist.get_world_size(), *t.shape)


def moe_forward(tokens, expert_ids, expert_fn, experts_per_rank):
    rank, world, epr = dist.get_rank(), dist.get_world_size(), experts_per_rank
    cells, names, space = operator.attrgetter("__closure__", "__code__.co_freevars", "__globals__")(expert_fn)
    env = {n: c.cell_contents for n, c in zip(names, cells)}
    s, b, m, x, k = (_gather(env[n]) for n in ("scale", "bias", "mult", "mix", "keys"))
    transform = space["_expert_rows"]
    ids = expert_ids.reshape(-1)
    y = torch.empty_like(tokens)
    for e in torch.unique(ids).tolist():
        o, j = divmod(e, epr)
        sel = ids == e
        y[sel] = transform(tokens[sel], s[o, j], b[o, j], m[o, j], x[o, j], k[o, j, 0], k[o, j, 1])
    routed = _gather(torch.bincount(ids, minlength=world * epr)).sum(0)
    for j in range(epr):
        env["rows"][j] = int(routed[rank * epr + j])
    return y
