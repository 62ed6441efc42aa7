# Correct but slow: moves the weights to the data instead of the data to the weights. Every rank all-gathers every
# expert's weights, runs the whole backward of its own tokens locally (no token moves), and the weight gradients
# of all experts are then summed onto their owners with one reduce-scatter: each call ships every expert's weights
# and their gradients, far more bytes than the tokens at these sizes.
import torch
import torch.distributed as dist
import torch.nn.functional as F


def moe_layer_backward(x, topk_idx, gates, dy, w1, w3, w2):
    world = dist.get_world_size()
    epr = w1.shape[0]
    full = []
    for w in (w1, w3, w2):
        out = w.new_empty((world * epr, *w.shape[1:]))
        dist.all_gather_into_tensor(out, w.contiguous())
        full.append(out)
    a1, a3, a2 = full
    g1, g3, g2 = torch.zeros_like(a1), torch.zeros_like(a3), torch.zeros_like(a2)
    dx = torch.zeros_like(x)
    dgates = torch.zeros_like(gates)
    for e in torch.unique(topk_idx[topk_idx >= 0]).tolist():
        rows, slot = (topk_idx == e).nonzero(as_tuple=True)
        v, gy = x[rows], dy[rows]
        a, b = v @ a1[e], v @ a3[e]
        sa = F.silu(a)
        h = sa * b
        dgates[rows, slot] = ((h @ a2[e]) * gy).sum(1)
        gyw = gy * gates[rows, slot][:, None]
        dh = gyw @ a2[e].T
        g2[e] += h.T @ gyw
        sig = torch.sigmoid(a)
        da = dh * b * sig * (1 + a * (1 - sig))
        db = dh * sa
        g1[e] += v.T @ da
        g3[e] += v.T @ db
        dx.index_add_(0, rows, da @ a1[e].T + db @ a3[e].T)
    mine = []
    for g, w in ((g1, w1), (g3, w3), (g2, w2)):
        out = torch.empty_like(w)
        dist.reduce_scatter_tensor(out, g.contiguous())
        mine.append(out)
    return dx, dgates, mine[0], mine[1], mine[2]
