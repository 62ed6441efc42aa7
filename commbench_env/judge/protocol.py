"""Framing between coordinator and ranks: JSON headers plus raw tensor bytes. Never pickle (ranks run hostile code)."""

from __future__ import annotations

import hashlib
import json
import socket
import struct
from typing import Any

# What `python -I -c` runs: the host's PYTHONPATH (where this package lives in a sandbox) without the start folder.
BOOTSTRAP = ("import os, sys; sys.path[:0] = [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p]; "
             "os.environ['COMMBENCH_JUDGE_PROCESS'] = '1'; "
             "from commbench_env.judge.__main__ import main; sys.exit(main())")
RESULT_MARK = "COMMBENCH-RESULT "  # the result's JSON follows this, on one line of the judge's stdout


def judge_command(python: str, *args: str) -> list[str]:
    """The command line that runs the judge with `args` in a sandbox."""
    return [python, "-I", "-c", BOOTSTRAP, *args]

_LEN = struct.Struct("!III")  # sequence number, header length, blob length
SAMPLES_PER_OUTPUT = 256  # positions of each timed call's output that the ranks send back for verification
# How a rank (or the device host, after `r/`) hands back the read-only inputs a call was shown, beside its outputs.
INPUT_PREFIX = "input:"
MAX_HEADER = 16 << 20
MAX_BLOB = 1 << 31


class ProtocolError(ValueError):
    """A frame that is not what the judge's protocol allows: too large, out of order, not a JSON object. From a rank
    this is that rank's failure (its code may write anything on its channel), never the judge's."""


def derive_seed(secret: bytes, *parts: object) -> int:
    """A 63-bit seed from the evaluation's secret and a label; ranks get these, never the secret."""
    h = hashlib.blake2b("/".join(str(p) for p in parts).encode(), key=secret[:64], digest_size=8)
    return int.from_bytes(h.digest(), "big") & 0x7FFF_FFFF_FFFF_FFFF


def pack(header: dict[str, Any], blob: bytes = b"", seq: int = 0) -> bytes:
    h = json.dumps(header, separators=(",", ":")).encode()
    return _LEN.pack(seq & 0xFFFF_FFFF, len(h), len(blob)) + h + blob


def _parse_header(raw: bytes) -> dict[str, Any]:
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ProtocolError(f"undecodable frame header ({type(exc).__name__})") from None
    if not isinstance(header, dict):
        raise ProtocolError("frame header is not a JSON object")
    return header


def _check_lengths(hlen: int, blen: int) -> None:
    if hlen > MAX_HEADER or blen > MAX_BLOB:
        raise ProtocolError(f"frame of {hlen} + {blen} bytes is over the limit")


def send_msg(sock: socket.socket, header: dict[str, Any], blob: bytes = b"", seq: int = 0) -> None:
    sock.sendall(pack(header, blob, seq))


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError("peer closed the channel")
        buf += chunk
    return bytes(buf)


def recv_header(sock: socket.socket, seq: int | None = None) -> tuple[dict[str, Any], int]:
    """Read a frame's header; returns it with the length of the blob still to be read (`recv_blob`)."""
    got, hlen, blen = _LEN.unpack(_recv_exact(sock, _LEN.size))
    _check_lengths(hlen, blen)
    if seq is not None and got != seq & 0xFFFF_FFFF:
        raise ProtocolError(f"frame {got} arrived where frame {seq} was due")
    return _parse_header(_recv_exact(sock, hlen)), blen


def recv_blob(sock: socket.socket, blen: int) -> bytes:
    return _recv_exact(sock, blen) if blen else b""


def recv_msg(sock: socket.socket, seq: int | None = None) -> tuple[dict[str, Any], bytes]:
    header, blen = recv_header(sock, seq)
    return header, recv_blob(sock, blen)


class Channel:
    """One end of a sequenced channel (a rank's or the device host's end): every frame is numbered, so a frame
    injected or swallowed by code in the same process shows as a protocol error instead of shifting the dialogue."""

    def __init__(self, sock: socket.socket):
        self.sock, self.sent, self.received = sock, 0, 0

    def send(self, header: dict[str, Any], blob: bytes = b"") -> None:
        send_msg(self.sock, header, blob, self.sent)
        self.sent += 1

    def recv(self) -> tuple[dict[str, Any], bytes]:
        msg = recv_msg(self.sock, self.received)
        self.received += 1
        return msg


class Reader:
    """Incremental decoder for a non-blocking socket (the coordinator reads many ranks at once). Frames must come in
    sequence and within the length limits; anything else raises ProtocolError."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.eof = False
        self.expect = 0

    def feed(self, data: bytes) -> None:
        if not data:
            self.eof = True
        self.buf += data

    def has_frame(self) -> bool:
        if len(self.buf) < _LEN.size:
            return False
        _, hlen, blen = _LEN.unpack_from(self.buf)
        return len(self.buf) >= _LEN.size + hlen + blen

    def pop(self) -> tuple[dict[str, Any], bytes] | None:
        if len(self.buf) < _LEN.size:
            return None
        seq, hlen, blen = _LEN.unpack_from(self.buf)
        _check_lengths(hlen, blen)
        if seq != self.expect & 0xFFFF_FFFF:
            raise ProtocolError(f"frame {seq} arrived where frame {self.expect} was due")
        end = _LEN.size + hlen + blen
        if len(self.buf) < end:
            return None
        header = _parse_header(bytes(self.buf[_LEN.size:_LEN.size + hlen]))
        blob = bytes(self.buf[_LEN.size + hlen:end])
        del self.buf[:end]
        self.expect += 1
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


def split_inputs(tensors: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A message's tensors as (outputs, the read-only inputs handed back, without their prefix)."""
    shown = {k[len(INPUT_PREFIX):]: v for k, v in tensors.items() if k.startswith(INPUT_PREFIX)}
    return {k: v for k, v in tensors.items() if not k.startswith(INPUT_PREFIX)}, shown


def sample_together(tensors: dict[str, Any], sample_seed: int, prefix: str = "") -> dict[str, Any]:
    """Samples of several tensors taken as one flat vector per dtype (names in sorted order): `PREFIX<dtype>` and
    its total size `PREFIX<dtype>#numel`. For the read-only inputs a call was shown, which may be hundreds of small
    tensors (a model's gradients): one gather per dtype instead of one per tensor. The coordinator samples the
    inputs it makes itself the same way and compares the two."""
    import torch

    gen = torch.Generator().manual_seed(int(sample_seed))
    groups: dict[str, list] = {}
    for _, t in sorted(tensors.items()):
        groups.setdefault(str(t.dtype).removeprefix("torch."), []).append(t.detach().reshape(-1))
    out = {}
    for dtype in sorted(groups):
        flat = torch.cat(groups[dtype]) if len(groups[dtype]) > 1 else groups[dtype][0]
        idx = sample_positions(flat.numel(), gen)
        out[prefix + dtype] = flat[idx.to(flat.device)].cpu()
        out[prefix + dtype + "#numel"] = torch.tensor([flat.numel()])
    return out


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


def decode_tensors(meta: Any, blob: bytes) -> dict[str, Any]:
    """Tensors from (metadata, bytes) sent by a rank; any inconsistency (unknown dtype, sizes that do not add up,
    a name used twice) is a ProtocolError, since a hostile rank may send anything."""
    import torch

    from ..golden.base import DTYPE_MAP

    if not isinstance(meta, list):
        raise ProtocolError("tensor metadata is not a list")
    out = {}
    for m in meta:
        try:
            name, dtype_name, offset, nbytes = m["name"], m["dtype"], int(m["offset"]), int(m["nbytes"])
            shape = [int(s) for s in m["shape"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"malformed tensor metadata ({type(exc).__name__}: {exc})") from None
        dtype = DTYPE_MAP.get(dtype_name) if isinstance(dtype_name, str) else None
        if dtype is None:
            raise ProtocolError(f"output {name!r} has an unsupported dtype {dtype_name!r}")
        if not isinstance(name, str) or name in out:
            raise ProtocolError(f"output name {name!r} is not a string or is sent twice")
        numel = 1
        for s in shape:
            if s < 0:
                raise ProtocolError(f"output {name!r} has a negative dimension")
            numel *= s
        itemsize = torch.empty((), dtype=dtype).element_size()
        if offset < 0 or nbytes != numel * itemsize or offset + nbytes > len(blob):
            raise ProtocolError(f"output {name!r}: {nbytes} bytes at {offset} do not hold shape {shape} of "
                                f"{dtype_name} in a blob of {len(blob)} bytes")
        if not nbytes:
            out[name] = torch.empty(shape, dtype=dtype)
            continue
        t = torch.frombuffer(bytearray(blob[offset:offset + nbytes]), dtype=torch.uint8).view(dtype)
        out[name] = t.reshape(shape)
    return out
