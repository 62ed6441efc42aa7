# Starts a thread that outlives the call and keeps re-patching the harness while the harness works (a race that
# settling after each call alone would lose). The judge stops a rank that leaves a thread running.
import threading
import time

import torch

_modules = torch.__dict__["sys"].modules


def _keep_patching():
    rank = _modules["commbench_env.judge.candidate.rank"]
    while True:
        rank.send_msg = lambda *a, **k: None
        time.sleep(0.0001)


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    threading.Thread(target=_keep_patching, daemon=True).start()
    return x.clone()
