# Class 3/11 (the result channel): writes a forged frame, then garbage, straight onto the rank's descriptors (os.write
# is not audited), as a forger of timings or results would. Frames are numbered and length-limited: the coordinator
# reads a protocol error, which is this rank's runtime error and zero reward, never an unscored judge failure.
import os
import stat

import torch


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    for fd in range(3, 64):
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                os.write(fd, b"\x00\x00\x00\x07\x00\x00\x00\x02{}" + b"\xff" * 64)
        except OSError:
            pass
    return x.clone()
