"""Golden semantics of CUDA tasks about synchronisation through peer memory: slots claimed with remote atomics."""

from __future__ import annotations

import torch

from . import register
from .base import GoldenOp, generator, int_param, num_param, private_length

RECORD_WORDS = 4  # a record is 4 int32 words (16 bytes)
BENCH_RECORD = (0x1234567, 0x2345678, 0x3456789, 0x456789A)  # every record of a benchmark call (see PeerSlotAppend)


def _record_key(rows: torch.Tensor) -> torch.Tensor:
    """Rows of 4 int32 words as one sortable key per row (lexicographic order of the words as unsigned)."""
    w = rows.to(torch.int64) & 0xFFFFFFFF
    return torch.stack([w[:, 0] << 32 | w[:, 1], w[:, 2] << 32 | w[:, 3]], 1)


def _sort_rows(rows: torch.Tensor) -> torch.Tensor:
    """Rows sorted lexicographically by their words (as unsigned 32-bit numbers)."""
    if rows.shape[0] < 2:
        return rows
    k = _record_key(rows)
    order = torch.argsort(k[:, 1], stable=True)
    order = order[torch.argsort(k[order, 0], stable=True)]
    return rows[order]


# ----------------------------------------------------------------------------------------------------------------
@register
class PeerSlotAppend(GoldenOp):
    """`append(x, dest) -> out`: every rank sends each of its records to the rank its `dest` names, where the record
    lands in the first free row of that rank's `out`; rows are claimed with atomics on the receiver's memory, so the
    order of the rows is free, but they are packed (no holes, no duplicates).

    Rank s holds n_s records, `x` int32 [n_s, 4] (words drawn in [0, 2^31 - 1), so never -1), and `dest` int32 [n_s]
    in [-1, world): -1 drops the record. Rank r's `out` is int32 [C, 4] with C = the sum of n_s over all ranks
    (every record could go to one rank): rows 0 .. m_r - 1 hold exactly the m_r records sent to r, in any order,
    and rows m_r .. C - 1 keep the -1 the judge fills them with.

    Card cases: shape [n] records per rank; params: `uneven` (each rank draws n_s in [0, n]), `empty_rank` (that
    rank mod world has none), `drop` (the share of records with dest -1), `target_rank` (every record goes to
    that rank mod world), `hot` (the share of records that go to rank 0; the rest uniform).

    Benchmark cases (params.bench): every record is the same (BENCH_RECORD), so the row order cannot matter and the
    judge's sampled check of timed calls (expected_samples) holds: rows 0 .. m_r - 1 are that record, rows from
    m_r on are -1. nccl-tests size: the bytes of one rank's records.
    """

    name = "peer_slot_append"
    nccl_op = None
    functions = ("append",)
    KNOWN = {"uneven", "empty_rank", "drop", "target_rank", "hot", "bench"}

    def validate_case(self, case):
        if case.dtype != "int32":
            raise ValueError("dtype must be int32 (the records' words)")
        if len(case.shape) != 1 or case.shape[0] < 0:
            raise ValueError("shape must be [n] with n >= 0 records per rank")
        unknown = set(case.params) - self.KNOWN
        if unknown:
            raise ValueError(f"unknown params {sorted(unknown)}; known: {sorted(self.KNOWN)}")
        for key in ("uneven", "bench"):
            if not isinstance(case.params.get(key, False), bool):
                raise ValueError(f"params.{key} must be true or false")
        for key in ("empty_rank", "target_rank"):
            if key in case.params:
                int_param(case, key, low=0)
        num_param(case, "drop", 0.0, 0.0, 1.0)
        num_param(case, "hot", 0.0, 0.0, 1.0)

    def capacity(self, case, world: int, inputs: list[dict]) -> int:
        return sum(int(i["dest"].numel()) for i in inputs)

    def make_inputs(self, case, rank, world, seed):
        g = generator(seed)
        n = private_length(case, rank, world, g)
        p = case.params
        if p.get("bench"):
            x = torch.tensor(BENCH_RECORD, dtype=torch.int32).repeat(n, 1)
        else:
            x = torch.randint(0, (1 << 31) - 1, (n, RECORD_WORDS), generator=g, dtype=torch.int64).to(torch.int32)
        if "target_rank" in p:
            dest = torch.full((n,), int(p["target_rank"]) % world, dtype=torch.int64)
        else:
            dest = torch.randint(0, world, (n,), generator=g, dtype=torch.int64)
            hot = float(p.get("hot", 0.0))
            if hot > 0 and n:
                dest[torch.rand(n, generator=g) < hot] = 0
        drop = float(p.get("drop", 0.0))
        if drop > 0 and n:
            dest[torch.rand(n, generator=g) < drop] = -1
        return {"x": x, "dest": dest.to(torch.int32)}

    def call(self, fns, inputs, case, rank, world):
        raise NotImplementedError("peer_slot_append is a cuda task: the device host calls the kernel")

    def received(self, world: int, inputs: list[dict]) -> list[torch.Tensor]:
        """Per rank, the records sent to it, in (source rank, index) order."""
        got = []
        for r in range(world):
            rows = [i["x"][i["dest"] == r] for i in inputs]
            got.append(torch.cat(rows) if rows else torch.zeros(0, RECORD_WORDS, dtype=torch.int32))
        return got

    def expected(self, case, world, inputs):
        """The outputs in one canonical order (rows by source rank, then index); any order of rows 0 .. m_r - 1 is
        correct (see verify). For benchmark sizes the rows are alike, so this order is the only one."""
        cap = self.capacity(case, world, inputs)
        if case.params.get("bench"):  # only the shape is used (expected_samples gives the values): no C-row copies
            return [{"out": torch.full((1, RECORD_WORDS), -1, dtype=torch.int32).expand(cap, RECORD_WORDS)}
                    for _ in range(world)]
        outs = []
        for rows in self.received(world, inputs):
            out = torch.full((cap, RECORD_WORDS), -1, dtype=torch.int32)
            out[:rows.shape[0]] = rows
            outs.append({"out": out})
        return outs

    def expected_samples(self, case, world, inputs, pick):
        """Benchmark calls only (their records are all alike): the values at the picked positions, without making
        the outputs of C rows per rank."""
        if not case.params.get("bench"):
            return None
        cap = self.capacity(case, world, inputs)
        rec = torch.tensor(BENCH_RECORD, dtype=torch.int32)
        values = []
        for r in range(world):
            m = sum(int((i["dest"] == r).sum()) for i in inputs)
            idx = pick(r, "out", cap * RECORD_WORDS)
            v = torch.full((idx.numel(),), -1, dtype=torch.int32)
            filled = idx // RECORD_WORDS < m
            v[filled] = rec[idx[filled] % RECORD_WORDS]
            values.append({"out": v})
        return values

    def verify(self, case, world, inputs, outputs, tol):
        cap = self.capacity(case, world, inputs)
        for r, want in enumerate(self.received(world, inputs)):
            got = outputs[r].get("out")
            base = {"case": case.name, "rank": r, "output": "out"}
            if got is None:
                return {**base, "reason": "missing"}
            if tuple(got.shape) != (cap, RECORD_WORDS) or got.dtype != torch.int32:
                return {**base, "reason": "shape", "expected": f"int32 [{cap}, {RECORD_WORDS}]",
                        "got": f"{str(got.dtype).removeprefix('torch.')} {list(got.shape)}"}
            m = want.shape[0]
            tail = got[m:]
            untouched = (tail == -1).all(1)
            if not bool(untouched.all()):
                row = m + int((~untouched).nonzero()[0])
                return {**base, "reason": "semantics", "index": [row],
                        "expected": "[-1, -1, -1, -1]", "got": str(got[row].tolist()),
                        "detail": f"rank {r} receives {m} records, so rows {m} .. {cap - 1} must keep -1; row {row} "
                                  f"was written ({int((~untouched).sum())} rows from {m} on were; slots claimed "
                                  f"twice or counters not starting from 0?)"}
            head = got[:m]
            holes = (head == -1).all(1)
            if bool(holes.any()):
                row = int(holes.nonzero()[0])
                return {**base, "reason": "semantics", "index": [row], "expected": "a received record",
                        "got": "[-1, -1, -1, -1]",
                        "detail": f"rank {r} receives {m} records, so rows 0 .. {m - 1} must all hold one; "
                                  f"{int(holes.sum())} of them were never written (row {row} is the first)"}
            a, b = _sort_rows(head), _sort_rows(want)
            diff = (a != b).any(1)
            if bool(diff.any()):
                k = int(diff.nonzero()[0])
                ka, kb = _record_key(a[k:k + 1])[0].tolist(), _record_key(b[k:k + 1])[0].tolist()
                extra, missing = (a[k], b[k]) if ka < kb else (None, b[k])
                if extra is not None:
                    what = f"row {extra.tolist()} is not a record sent to rank {r} (or is there twice)"
                else:
                    what = f"the record {missing.tolist()} sent to rank {r} is missing (or another one is doubled)"
                return {**base, "reason": "value", "expected": str(b[k].tolist()), "got": str(a[k].tolist()),
                        "wrong_count": int(diff.sum()), "total_count": m,
                        "detail": f"rows 0 .. {m - 1} of rank {r}, compared as a set of records (any order): {what}"}
        return None

    def size_case(self, perf, size_bytes, world):
        from ..cards import CaseSpec

        n = max(1, size_bytes // (4 * RECORD_WORDS))
        return CaseSpec(name=f"bench-{size_bytes}", visible=False, shape=[n], dtype="int32",
                        params={**perf.params, "bench": True})

    def metric_bytes(self, case, world):
        return int(case.shape[0]) * 4 * RECORD_WORDS
