"""Golden semantics of utility_data tasks (issue #22, second part): distributed data movement.

- `reshard_block_cyclic`: a 2-D tensor sharded in uneven row blocks is redistributed to a 2-D block-cyclic layout
  over a process grid, as ScaLAPACK lays matrices out (utility/reshard_tensor);
- `sample_sort`: a distributed sort of int64 keys whose result is load-balanced exactly, with every key's origin
  (utility/sample_sort).
"""

from __future__ import annotations

import math

import torch

from . import register
from .base import CandidateError, GoldenOp, elem_size as _elem, expect_tensor, generator, int_param, rand
from .compare import first_mismatch

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def _shared_seed(*parts: int) -> int:
    """A seed every rank (and the coordinator) derives alike from public case data."""
    s = 0x9E3779B97F4A7C15
    for p in parts:
        s = (s * 0x100000001B3 ^ (int(p) & 0xFFFF_FFFF_FFFF)) & 0x7FFF_FFFF_FFFF_FFFF
    return s


def _exact(m: dict | None, what: str) -> dict | None:
    """A mismatch of a bit-exact comparison, without the tolerance figures (a tolerance of 0 makes them noise)."""
    if m:
        for key in ("rtol", "atol", "worst_tolerance_ratio", "rel_error"):
            m.pop(key, None)
        m.setdefault("detail", what)
    return m


# ----------------------------------------------------------------------------------------------------------------
def cyclic_indices(n: int, block: int, coord: int, procs: int) -> torch.Tensor:
    """The global indices 0..n-1 that a block-cyclic distribution (blocks of `block`, dealt round-robin over
    `procs` processes) gives process `coord`, in increasing order."""
    i = torch.arange(n, dtype=torch.int64)
    return i[(i // block) % procs == coord]


def numroc(n: int, block: int, coord: int, procs: int) -> int:
    """How many of n indices process `coord` of `procs` holds under a block-cyclic distribution (ScaLAPACK's
    NUMROC with the first block on process 0)."""
    full, rest = divmod(n, block * procs)
    return full * block + min(max(rest - coord * block, 0), block)


@register
class ReshardBlockCyclic(GoldenOp):
    """`reshard(x, src_rows, grid, block) -> local`: the global matrix A [M, N] is sharded in row blocks: rank r
    holds rows R_r .. R_r + src_rows[r] - 1 (R_r = the sum of the earlier src_rows). Rank r < pr * pc, at grid
    position (p, q) = (r // pc, r % pc), returns A[rows_p][:, cols_q], where rows_p are the global rows i with
    (i // br) % pr == p and cols_q the columns j with (j // bc) % pc == q, both in increasing order (ScaLAPACK's
    local array); ranks r >= pr * pc return an empty [0, 0] tensor.

    Card cases: shape = [M, N]; params:
    - grid: "square" (pr = the largest divisor of the world <= its square root, pc = world / pr), "tall" (the
      transpose of square), "1xP", "Px1", or [pr, pc] (a world smaller than pr * pc skips the case);
    - block: [br, bc], 0 meaning one block per process (ceil(M / pr) or ceil(N / pc): a plain block layout);
    - split: how the rows are spread over the source ranks (public, the same on every rank): "random" (default:
      log-normal weights from params.layout_seed), "even", "single" (all on rank split_rank, default the last),
      "match" (exactly the destination's rows: only with grid "Px1" and block [0, *], an identity resharding);
      empty_rank (mod world) holds no rows in a "random" split.
    Benchmark cases (`bench`): rank r holds a share of the rows proportional to r + 1. nccl-tests size: the bytes
    of A divided by the world size (the average rank's share).
    """

    name = "reshard_block_cyclic"
    nccl_op = None
    functions = ("reshard",)
    GRIDS = ("square", "tall", "1xP", "Px1")
    SPLITS = ("random", "even", "single", "match")
    KEYS = {"grid", "block", "split", "empty_rank", "split_rank", "layout_seed", "bench", "cols"}

    def validate_case(self, case):
        if len(case.shape) != 2:
            raise ValueError("shape must be [M, N]: the global matrix")
        unknown = set(case.params) - self.KEYS
        if unknown:
            raise ValueError(f"unknown params {sorted(unknown)}; known: {sorted(self.KEYS)}")
        grid = case.params.get("grid")
        ok = grid in self.GRIDS or (isinstance(grid, list) and len(grid) == 2
                                    and all(type(v) is int and v >= 1 for v in grid))
        if not ok:
            raise ValueError(f"params.grid must be one of {list(self.GRIDS)} or [pr, pc] with both >= 1, got {grid!r}")
        block = case.params.get("block")
        if not (isinstance(block, list) and len(block) == 2 and all(type(v) is int and v >= 0 for v in block)):
            raise ValueError(f"params.block must be [br, bc] with both >= 0 (0: one block per process), got {block!r}")
        split = case.params.get("split", "random")
        if split not in self.SPLITS:
            raise ValueError(f"params.split must be one of {list(self.SPLITS)}, got {split!r}")
        if split == "match" and (grid != "Px1" or block[0] != 0):
            raise ValueError('params.split "match" needs grid "Px1" and block [0, bc] (the identity resharding)')
        for key in ("empty_rank", "split_rank", "layout_seed"):
            int_param(case, key, optional=True)

    def grid(self, case, world: int) -> tuple[int, int]:
        g = case.params["grid"]
        if isinstance(g, list):
            return int(g[0]), int(g[1])
        if g == "1xP":
            return 1, world
        if g == "Px1":
            return world, 1
        pr = max(d for d in range(1, math.isqrt(world) + 1) if world % d == 0)
        return (pr, world // pr) if g == "square" else (world // pr, pr)

    def block(self, case, world: int) -> tuple[int, int]:
        m, n = (int(s) for s in case.shape)
        pr, pc = self.grid(case, world)
        br, bc = (int(v) for v in case.params["block"])
        return br or max(1, -(-m // pr)), bc or max(1, -(-n // pc))

    def supports_world(self, world, case):
        pr, pc = self.grid(case, world)
        return pr * pc <= world

    def src_rows(self, case, world: int) -> list[int]:
        m = int(case.shape[0])
        p = case.params
        split = p.get("split", "random")
        if p.get("bench"):
            tri = world * (world + 1) // 2
            edges = [m * (r * (r + 1) // 2) // tri for r in range(world + 1)]
            return [edges[r + 1] - edges[r] for r in range(world)]
        if split == "even":
            return [(r + 1) * m // world - r * m // world for r in range(world)]
        if split == "single":
            owner = int(p.get("split_rank", world - 1)) % world
            return [m if r == owner else 0 for r in range(world)]
        if split == "match":
            br, _ = self.block(case, world)
            return [numroc(m, br, r, world) for r in range(world)]
        g = generator(_shared_seed(int(p.get("layout_seed", 0)), world, m, int(case.shape[1])))
        w = torch.exp(torch.randn(world, generator=g, dtype=torch.float64))
        if "empty_rank" in p:
            w[int(p["empty_rank"]) % world] = 0.0
        edges = torch.floor(torch.cumsum(w, 0) / w.sum() * m + 0.5).to(torch.int64).tolist()
        edges = [0] + edges[:-1] + [m]
        return [edges[r + 1] - edges[r] for r in range(world)]

    def make_inputs(self, case, rank, world, seed):
        rows = self.src_rows(case, world)
        pr, pc = self.grid(case, world)
        br, bc = self.block(case, world)
        x = rand([rows[rank], int(case.shape[1])], case.dtype, generator(seed), low=-1000, high=1000)
        return {"x": x, "src_rows": torch.tensor(rows, dtype=torch.int64),
                "grid": torch.tensor([pr, pc], dtype=torch.int64), "block": torch.tensor([br, bc], dtype=torch.int64)}

    def call(self, fns, inputs, case, rank, world):
        rows = [int(v) for v in inputs["src_rows"].tolist()]
        pr, pc = (int(v) for v in inputs["grid"].tolist())
        br, bc = (int(v) for v in inputs["block"].tolist())
        y = fns["reshard"](inputs["x"], rows, (pr, pc), (br, bc))
        return {"local": expect_tensor(y, "reshard's return value")}

    def expected(self, case, world, inputs):
        a = torch.cat([i["x"] for i in inputs], dim=0)
        m, n = a.shape
        pr, pc = self.grid(case, world)
        br, bc = self.block(case, world)
        out = []
        for r in range(world):
            if r >= pr * pc:
                out.append({"local": a.new_empty((0, 0))})
                continue
            rows = cyclic_indices(m, br, r // pc, pr)
            cols = cyclic_indices(n, bc, r % pc, pc)
            out.append({"local": a.index_select(0, rows).index_select(1, cols)})
        return out

    def verify(self, case, world, inputs, outputs, tol):
        pr, pc = self.grid(case, world)
        br, bc = self.block(case, world)
        m = first_mismatch(case, self.expected(case, world, inputs), outputs, (0.0, 0.0))
        if m and m.get("reason") == "shape":
            r = m["rank"]
            m["detail"] = (f"rank {r} is outside the {pr} x {pc} grid and returns a [0, 0] tensor" if r >= pr * pc
                           else f"rank {r} is grid position ({r // pc}, {r % pc}) of {pr} x {pc} with blocks "
                                f"({br}, {bc}): its local array has numroc(M, br, p, pr) rows and "
                                f"numroc(N, bc, q, pc) columns")
        return _exact(m, "elements are moved, not computed: they must match bit for bit")

    def size_case(self, perf, size_bytes, world):
        from ..cards import CaseSpec

        params = {"grid": "square", "block": [32, 32], **perf.params, "bench": True}
        cols = int(params.get("cols", 1024))
        rows = max(world, size_bytes * world // (cols * _elem(perf.dtype)))
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[rows, cols], dtype=perf.dtype,
                        params=params)

    def metric_bytes(self, case, world):
        return int(case.shape[0]) * int(case.shape[1]) * _elem(case.dtype) // world


# ----------------------------------------------------------------------------------------------------------------
def _int64_output(value, what: str) -> torch.Tensor:
    t = expect_tensor(value, what)
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise CandidateError(f"{what} must be an integer tensor, got {t.dtype}")
    if t.dim() != 1:
        raise CandidateError(f"{what} must be 1-D, got shape {list(t.shape)}")
    return t.detach().to(torch.int64)


def global_order(keys: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every rank's keys in the total order (key, source rank, source index): (keys, ranks, indices)."""
    k = torch.cat([torch.zeros(0, dtype=torch.int64)] + [t.reshape(-1).to(torch.int64) for t in keys])
    src = torch.cat([torch.zeros(0, dtype=torch.int64)]
                    + [torch.full((t.numel(),), r, dtype=torch.int64) for r, t in enumerate(keys)])
    idx = torch.cat([torch.zeros(0, dtype=torch.int64)] + [torch.arange(t.numel(), dtype=torch.int64) for t in keys])
    # concatenated in (rank, index) order, so a stable sort on the key alone gives the whole order
    order = torch.sort(k, stable=True).indices
    return k[order], src[order], idx[order]


@register
class SampleSort(GoldenOp):
    """`sample_sort(keys) -> (keys, src_rank, src_index)`: a distributed sort. With N keys in all, ordered by
    (key, source rank, source index), rank r returns the global positions floor(r N / W) .. floor((r+1) N / W) - 1:
    the keys, the rank that held each, and its index in that rank's input.

    Card cases: shape = [n]: each rank's count is drawn from its own seed in [0, n] (params.even: exactly n);
    params.empty_rank (mod world) holds no keys, params.single_rank (mod world) holds all of them (n * world
    keys, the others none). params.keys: "uniform" (default: uniform over case.int_range, or over all of int64
    without one), "equal" (one value everywhere), "extremes" (mostly int64's minimum, maximum, 0 and -1),
    "hot" (most keys on a few values shared by every rank), "sorted" (the input already in order: each rank's keys
    ascending, rank r's all below rank r+1's), "reversed" (the input in reverse order). Benchmark cases
    (`bench`): shape = [total]; rank r holds a share proportional to r + 1 of uniform int64 keys. nccl-tests size:
    the bytes of all keys divided by the world size (the average rank's share).
    """

    name = "sample_sort"
    nccl_op = None
    functions = ("sample_sort",)
    KEYS_KINDS = ("uniform", "equal", "extremes", "hot", "sorted", "reversed")
    PARAMS = {"keys", "even", "empty_rank", "single_rank", "bench"}
    HOT_VALUES = 3

    def validate_case(self, case):
        if case.dtype != "int64":
            raise ValueError("dtype must be int64 (the keys)")
        if len(case.shape) != 1:
            raise ValueError("shape must be [n]: the most keys a rank holds")
        unknown = set(case.params) - self.PARAMS
        if unknown:
            raise ValueError(f"unknown params {sorted(unknown)}; known: {sorted(self.PARAMS)}")
        kind = case.params.get("keys", "uniform")
        if kind not in self.KEYS_KINDS:
            raise ValueError(f"params.keys must be one of {list(self.KEYS_KINDS)}, got {kind!r}")
        for key in ("empty_rank", "single_rank"):
            int_param(case, key, optional=True)
        if "even" in case.params and not isinstance(case.params["even"], bool):
            raise ValueError("params.even must be true or false")

    def count(self, case, rank: int, world: int, g: torch.Generator) -> int:
        n = int(case.shape[0])
        p = case.params
        if p.get("bench"):
            tri = world * (world + 1) // 2
            return n * ((rank + 1) * (rank + 2) // 2) // tri - n * (rank * (rank + 1) // 2) // tri
        if "single_rank" in p:
            return n * world if rank == int(p["single_rank"]) % world else 0
        if "empty_rank" in p and rank == int(p["empty_rank"]) % world:
            return 0
        return n if p.get("even") else int(torch.randint(0, n + 1, (1,), generator=g))

    @staticmethod
    def _full_range(n: int, g: torch.Generator) -> torch.Tensor:
        return torch.randint(0, 256, (n * 8,), generator=g, dtype=torch.uint8).view(torch.int64).clone()

    def make_inputs(self, case, rank, world, seed):
        g = generator(seed)
        n = self.count(case, rank, world, g)
        kind = case.params.get("keys", "uniform")
        shared = generator(_shared_seed(int(case.shape[0]), world, len(case.name)))  # values every rank shares
        if kind == "equal":
            keys = torch.full((n,), int(self._full_range(1, shared)[0]), dtype=torch.int64)
        elif kind == "extremes":
            pool = torch.tensor([INT64_MIN, INT64_MAX, 0, -1, INT64_MIN + 1, INT64_MAX - 1], dtype=torch.int64)
            keys = pool[torch.randint(0, len(pool), (n,), generator=g)]
            rnd = torch.rand(n, generator=g) < 0.2
            keys[rnd] = self._full_range(int(rnd.sum()), g)
        elif kind == "hot":
            hot = self._full_range(self.HOT_VALUES, shared)
            keys = hot[torch.randint(0, self.HOT_VALUES, (n,), generator=g)]
            rnd = torch.rand(n, generator=g) < 0.1
            keys[rnd] = self._full_range(int(rnd.sum()), g)
        elif case.int_range:
            lo, hi = case.int_range
            keys = torch.randint(lo, hi, (n,), generator=g, dtype=torch.int64)
        else:
            keys = self._full_range(n, g)
        if kind in ("sorted", "reversed"):
            # the whole input already in order (rank 0's keys the smallest, each rank's ascending), or in reverse
            band = rank if kind == "sorted" else world - 1 - rank
            keys = torch.sort(torch.remainder(keys, 1 << 40) + (band << 41) - (1 << 44),
                              descending=kind == "reversed").values
        return {"keys": keys}

    def call(self, fns, inputs, case, rank, world):
        res = fns["sample_sort"](inputs["keys"])
        if not isinstance(res, (tuple, list)) or len(res) != 3:
            raise CandidateError("sample_sort must return a tuple of three 1-D integer tensors (keys, src_rank, "
                                 f"src_index), got {type(res).__name__}"
                                 + (f" of length {len(res)}" if isinstance(res, (tuple, list)) else ""))
        names = ("keys", "src_rank", "src_index")
        return {n: _int64_output(t, f"sample_sort(...)[{i}] ({n})") for i, (n, t) in enumerate(zip(names, res))}

    def expected(self, case, world, inputs):
        k, src, idx = global_order([i["keys"] for i in inputs])
        total = k.numel()
        out = []
        for r in range(world):
            lo, hi = r * total // world, (r + 1) * total // world
            out.append({"keys": k[lo:hi].clone(), "src_rank": src[lo:hi].clone(), "src_index": idx[lo:hi].clone()})
        return out

    def verify(self, case, world, inputs, outputs, tol):
        total = sum(int(i["keys"].numel()) for i in inputs)
        exp = self.expected(case, world, inputs)
        for r in range(world):
            for name in ("keys", "src_rank", "src_index"):
                got = outputs[r].get(name)
                if got is None:
                    return {"case": case.name, "rank": r, "output": name, "reason": "missing"}
                want = exp[r][name].numel()
                if tuple(got.shape) != (want,):
                    return {"case": case.name, "rank": r, "output": name, "reason": "shape",
                            "expected": str([want]), "got": str(list(got.shape)),
                            "detail": f"with N = {total} keys in all, rank {r} holds global positions "
                                      f"floor({r} N / {world}) .. floor({r + 1} N / {world}) - 1: {want} keys"}
        return _exact(first_mismatch(case, exp, outputs, (0.0, 0.0)),
                      "rank r holds the keys at global positions floor(r N / W) .. floor((r+1) N / W) - 1 of the "
                      "order by (key, source rank, source index)")

    def size_case(self, perf, size_bytes, world):
        from ..cards import CaseSpec

        total = max(world, size_bytes * world // 8)
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[total], dtype="int64",
                        params={**perf.params, "bench": True})

    def metric_bytes(self, case, world):
        if case.params.get("bench"):
            return int(case.shape[0]) * 8 // world
        return int(case.shape[0]) * 8 // 2  # counts are uniform in [0, n]
