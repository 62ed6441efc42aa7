# Tries to ignore SIGTERM, then sleeps: the judge must kill it with SIGKILL at the time limit and report the hung
# ranks. (Candidate code runs on a thread of its own, and Python sets signal handlers only from the main thread,
# so the first step already fails; the sleep must still end at the limit.)
import signal
import time

import torch

try:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
except ValueError:
    pass


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    time.sleep(10**6)
    return x
