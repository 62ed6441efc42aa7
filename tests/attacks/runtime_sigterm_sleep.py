# Ignores SIGTERM and sleeps: the judge must kill it with SIGKILL at the time limit and report the hung ranks.
import signal
import time

import torch

signal.signal(signal.SIGTERM, signal.SIG_IGN)


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    time.sleep(10**6)
    return x
