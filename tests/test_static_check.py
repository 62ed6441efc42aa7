"""The static check on its own: aliases, getattr, imports, introspection; it never executes the source."""

from __future__ import annotations

import pytest

from commbench_env.judge.rules import expand_forbidden
from commbench_env.judge.coordinator.static_check import check_source

FORBIDDEN, ATTRS = expand_forbidden(["@collectives"])


def check(src: str):
    return check_source(src, "solution.py", FORBIDDEN, ATTRS, required=["f"])


OK = "import torch\nimport torch.distributed as dist\n\ndef f(x):\n    dist.send(x, 1)\n    return x\n"


def test_clean_code_passes():
    rep = check(OK)
    assert rep.ok, rep.log


@pytest.mark.parametrize("src,rule", [
    ("import torch.distributed as d\ndef f(x):\n    d.all_reduce(x)\n", "forbidden_api"),
    ("from torch.distributed import all_reduce as ar\ndef f(x):\n    ar(x)\n", "forbidden_api"),
    ("import torch\ndef f(x):\n    torch.distributed.distributed_c10d.all_gather([x], x)\n", "forbidden_api"),
    ("import torch.distributed as d\ng = d\ndef f(x):\n    g.broadcast(x, 0)\n", "forbidden_api"),
    ("import torch.distributed as d\ndef f(x):\n    getattr(d, 'all_' + 'reduce')(x)\n", "dynamic_attribute"),
    ("import torch.distributed as d\ndef f(x):\n    getattr(d, 'barrier')()\n", "forbidden_api"),
    ("import torch.distributed as d\ndef f(x):\n    d.group.WORLD.allreduce([x])\n", "forbidden_api"),
    ("import torch\ndef f(x):\n    torch.distributed.nn.functional.all_reduce(x)\n", "forbidden_api"),
    ("import os\ndef f(x):\n    return x\n", "forbidden_import"),
    ("import torch._C\ndef f(x):\n    return x\n", "forbidden_import"),
    ("from torch import *\ndef f(x):\n    return x\n", "forbidden_import"),
    ("def f(x):\n    return open('/tmp/x').read()\n", "forbidden_builtin"),
    ("def f(x):\n    return eval('1')\n", "forbidden_builtin"),
    ("def f(x):\n    return x.__class__\n", "private_access"),
    ("def f(x):\n    return __builtins__\n", "private_access"),
    ("import torch\ndef f(x):\n    torch.save(x, 'p')\n", "forbidden_api"),
    ("def f(x):\n    return x.numpy().tofile('p')\n", "forbidden_api"),
    ("def f(x):\n    setattr(x, 'a', 1)\n", "forbidden_builtin"),
])
def test_violations(src, rule):
    rep = check(src)
    assert not rep.ok
    assert any(v["rule"] == rule for v in rep.violations), rep.log
    assert all(v["line"] for v in rep.violations)


def test_syntax_error_never_executes(tmp_path):
    marker = tmp_path / "ran"
    rep = check(f"open({str(marker)!r}, 'w').write('x')\ndef f(:\n")
    assert rep.syntax_error and not marker.exists()
    assert "line 2" in rep.log


def test_missing_function():
    rep = check("import torch\n")
    assert not rep.ok and "missing required function(s): f" in rep.log


def test_p2p_tasks_keep_send_recv():
    forbidden, attrs = expand_forbidden(["@collectives"])
    assert "torch.distributed.send" not in forbidden and "torch.distributed.all_reduce" in forbidden
    forbidden, attrs = expand_forbidden(["torch.distributed.all_reduce"])
    assert "allreduce" in attrs and "barrier" not in attrs
    with pytest.raises(ValueError):
        expand_forbidden(["@nothing"])


@pytest.mark.parametrize("src", [
    "import torch\ndef f(x):\n    return torch.gather(x, 0, x.long())\n",
    "import torch\ndef f(x):\n    return x.gather(0, x.long()).scatter(0, x.long(), x)\n",
    "import functools\ndef f(x):\n    return functools.reduce(lambda a, b: a + b, [x, x])\n",
    "import torch\ndef f(x):\n    return torch.broadcast_tensors(x, x)[0]\n",
])
def test_tensor_methods_named_like_collectives_are_fine(src):
    rep = check(src)
    assert rep.ok, rep.log


def test_newer_collectives_and_store_access_are_caught():
    for src in ("import torch.distributed as d\ndef f(x):\n    d.all_gather_single(x, x)\n",
                "import torch.distributed as d\ndef f(x):\n    d.group.WORLD.all_to_all_single(x, x)\n",
                "import torch.distributed as d\ndef f(x):\n    d.group.WORLD.get_group_store().set('k', 'v')\n"):
        assert not check(src).ok


@pytest.mark.parametrize("src", [
    "import torch\ns = torch.cuda.Stream()\n",
    "import torch\ns = torch.cuda.streams.Stream()\n",
    "from torch.cuda import stream\n",
    "import torch\nS = getattr(torch.cuda, 'Stream')\n",
    "import torch.cuda as tc\ng = tc.CUDAGraph()\n",
    "import torch\ns = torch.Stream('cuda')\n",
    "import torch\nm = torch.get_device_module('cuda')\n",
])
def test_torch_tasks_may_not_make_or_switch_cuda_streams(src):
    """Work on a stream of the candidate's own is ordered neither after the judge's start mark nor before its stop
    mark (tests/attacks/side_stream.py), so every task refuses it, whatever its card forbids."""
    forbidden, attrs = expand_forbidden([])
    rep = check_source(src, "solution.py", forbidden, attrs)
    assert not rep.ok
    assert any("current CUDA stream" in v["detail"] for v in rep.violations), rep.log


def test_the_current_stream_stays_usable():
    forbidden, attrs = expand_forbidden([])
    src = "import torch\n\ndef f(x):\n    torch.cuda.current_stream().synchronize()\n    return x\n"
    assert check_source(src, "solution.py", forbidden, attrs).ok
