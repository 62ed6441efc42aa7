# Class 6 (/proc side channels): reads the coordinator's and other processes' /proc entries through paths the audit
# hook's prefix test does not recognise (/proc/./PID, /proc//PID). Landlock allows only the rank's own /proc entry.
import os

import torch


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    parent = os.getppid()
    for path in (f"/proc/./{parent}/cmdline", f"/proc//{parent}/environ", f"/proc/{parent}/../{parent}/status",
                 "/proc/./1/cmdline"):
        try:
            with open(path, "rb") as f:
                data = f.read(200)
            print("PROC-LEAK", path, data[:60])
        except OSError as exc:
            print("DENIED", path, type(exc).__name__)
    return x.clone()
