# Opens its own socket to another rank.
import socket

import torch


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    s = socket.socket()
    s.connect(("127.0.0.1", 1))
    return x.clone()
