"""Framing between coordinator and ranks: JSON headers plus raw tensor bytes. Never pickle (ranks run hostile code)."""

from __future__ import annotations

import hashlib
import json
import socket
import struct
from typing import Any

_LEN = struct.Struct("!II")
SAMPLES_PER_OUTPUT = 256  # positions of each timed call's output that the ranks send back for verification
MAX_HEADER = 16 << 20
MAX_BLOB = 1 << 31


def derive_seed(secret: bytes, *parts: object) -> int:
    """A 63-bit seed from the evaluation's secret and a label; ranks get these, never the secret."""
    h = hashlib.blake2b("/".join(str(p) for p in parts).encode(), key=secret[:64], digest_size=8)
    return int.from_bytes(h.digest(), "big") & 0x7FFF_FFFF_FFFF_FFFF


def pack(header: dict[str, Any], blob: bytes = b"") -> bytes:
    h = json.dumps(header, separators=(",", ":")).encode()
    return _LEN.pack(len(h), len(blob)) + h + blob


def send_msg(sock: socket.socket, header: dict[str, Any], blob: bytes = b"") -> None:
    sock.sendall(pack(header, blob))


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError("peer closed the channel")
        buf += chunk
    return bytes(buf)


def recv_msg(sock: socket.socket) -> tuple[dict[str, Any], bytes]:
    hlen, blen = _LEN.unpack(_recv_exact(sock, _LEN.size))
    if hlen > MAX_HEADER or blen > MAX_BLOB:
        raise ValueError("message too large")
    header = json.loads(_recv_exact(sock, hlen))
    return header, _recv_exact(sock, blen) if blen else b""


class Reader:
    """Incremental decoder for a non-blocking socket (the coordinator reads many ranks at once)."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.eof = False

    def feed(self, data: bytes) -> None:
        if not data:
            self.eof = True
        self.buf += data

    def pop(self) -> tuple[dict[str, Any], bytes] | None:
        if len(self.buf) < _LEN.size:
            return None
        hlen, blen = _LEN.unpack_from(self.buf)
        if hlen > MAX_HEADER or blen > MAX_BLOB:
            raise ValueError("message too large")
        end = _LEN.size + hlen + blen
        if len(self.buf) < end:
            return None
        header = json.loads(bytes(self.buf[_LEN.size:_LEN.size + hlen]))
        blob = bytes(self.buf[_LEN.size + hlen:end])
        del self.buf[:end]
        if not isinstance(header, dict):
            raise ValueError("header is not an object")
        return header, blob


def sample_positions(numel: int, generator: Any) -> Any:
    """The flat positions of one output at which a timed call is checked. Ranks and the coordinator both draw them
    here, from one generator per rank seeded with the call's sample seed, outputs in sorted name order: an empty
    output draws nothing."""
    import torch

    if not numel:
        return torch.zeros(0, dtype=torch.long)
    return torch.randint(0, numel, (min(SAMPLES_PER_OUTPUT, numel),), generator=generator)


def sample_outputs(outputs: dict[str, Any], sample_seed: int, prefix: str = "") -> dict[str, Any]:
    """One rank's outputs at `sample_positions`, gathered where they live (only the samples cross to the host),
    each with its size under `NAME#numel`; names get `prefix` (the device host sends every rank's at once)."""
    import torch

    gen = torch.Generator().manual_seed(int(sample_seed))
    sampled = {}
    for name, t in sorted(outputs.items()):
        flat = t.detach().reshape(-1)
        idx = sample_positions(flat.numel(), gen)
        sampled[prefix + name] = flat[idx.to(flat.device)].cpu()
        sampled[prefix + name + "#numel"] = torch.tensor([flat.numel()])
    return sampled


def encode_tensors(tensors: dict[str, Any]) -> tuple[list[dict[str, Any]], bytes]:
    """Tensors to (metadata, bytes); raw little-endian storage, so bfloat16 travels too."""
    import torch

    meta, parts, offset = [], [], 0
    for name, t in tensors.items():
        t = t.detach().to("cpu").contiguous()
        flat = t.reshape(-1)
        if flat.numel() and flat.stride(0) != 1:  # a one-element view is "contiguous" whatever its stride
            flat = flat.clone(memory_format=torch.contiguous_format)
        raw = flat.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        meta.append({"name": name, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                     "offset": offset, "nbytes": len(raw)})
        parts.append(raw)
        offset += len(raw)
    return meta, b"".join(parts)


def decode_tensors(meta: list[dict[str, Any]], blob: bytes) -> dict[str, Any]:
    import torch

    from ..golden.base import DTYPE_MAP

    out = {}
    for m in meta:
        dtype = DTYPE_MAP.get(m["dtype"])
        if dtype is None:
            raise ValueError(f"unsupported dtype {m['dtype']!r}")
        shape = [int(s) for s in m["shape"]]
        raw = blob[m["offset"]:m["offset"] + m["nbytes"]]
        if not raw:
            out[m["name"]] = torch.empty(shape, dtype=dtype)
            continue
        t = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype)
        out[m["name"]] = t.reshape(shape)
    return out
