"""The hardware a CPU evaluation's modelled time stands for: a sandbox profile's `[link_model]` table (the host
sends it in the request; the coordinator models each call on it)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class LinkModel(BaseModel):
    """Per-rank port bandwidth (each direction) and per-message latency of the modelled hardware.

    The default is one NVIDIA H200 per rank on an NVSwitch: 370 GB/s is what an SM copy kernel reached between two
    H200s (of 478 GB/s raw over 18 NVLinks; measured 2026-11-29 on the two-H200 machine), and 2 us per message is of the order
    of a peer flag's round trip (1.66 us) plus a launch; each message also holds its sender's port for 0.5 us (a
    launch's or a descriptor's cost), so a thousand tiny messages are not free. Change them to model other
    hardware."""

    model_config = ConfigDict(extra="forbid")

    name: str = "h200-nvswitch"
    description: str = ("one NVIDIA H200 per rank on an NVSwitch: 370 GB/s per direction per GPU (an SM copy "
                        "kernel's measured peer bandwidth, of 478 GB/s raw over 18 NVLinks), 2 us latency and "
                        "0.5 us of the sender's port per message")
    port_gbps: float = Field(default=370.0, gt=0)
    alpha_us: float = Field(default=2.0, ge=0, description="latency of one message, from its start to its arrival "
                            "beyond the bytes' own time")
    overhead_us: float = Field(default=0.5, ge=0, description="time a message holds its sender's port beyond its "
                               "bytes (LogGP's gap): posting many messages at once is not free")

    def transfer_us(self, nbytes: int) -> float:
        return nbytes / (self.port_gbps * 1e3)  # GB/s = 1e3 bytes per us

    def collective_us(self, kind: str, members: int, nbytes: int) -> float:
        """NCCL's ring cost for a library collective over `members` ranks; `nbytes` as nccl-tests counts the size
        (all-reduce: the buffer; all-gather / reduce-scatter / all-to-all: the whole output or input)."""
        p, a = members, self.alpha_us
        if p <= 1:
            return 0.0
        if kind == "allreduce":
            return 2 * (p - 1) * a + self.transfer_us(2 * (p - 1) * nbytes // p)
        if kind in ("allgather", "reduce_scatter"):
            return (p - 1) * a + self.transfer_us((p - 1) * nbytes // p)
        if kind == "alltoall":  # every peer at once, as NCCL's all-to-all does
            return a + (p - 1) * self.overhead_us + self.transfer_us((p - 1) * nbytes // p)
        if kind in ("broadcast", "reduce", "gather", "scatter"):
            return (p - 1) * a + self.transfer_us(nbytes)
        return 2 * a * max(1, (p - 1).bit_length())  # barrier: a dissemination barrier's rounds


HOST_POSTED_CLUSTER = LinkModel(
    name="host-posted-cluster",
    description=("one host per rank on a 100 Gb/s Ethernet switch, messages posted by the host CPU through its "
                 "kernel's network stack: 12.5 GB/s per direction per rank, 3 us latency and 8 us of the sender's "
                 "port per message (posting one costs more than its flight), as MPI over TCP sees it"),
    port_gbps=12.5, alpha_us=3.0, overhead_us=8.0)

LINK_MODELS: dict[str, LinkModel] = {m.name: m for m in (LinkModel(), HOST_POSTED_CLUSTER)}
"""Link models a task card may name (`[performance] link_model`) when its problem is set on other hardware than
the sandbox profile's: algorithms that save messages (recursive doubling, Bruck) are the expert answer only where
a message costs more than its bytes."""
