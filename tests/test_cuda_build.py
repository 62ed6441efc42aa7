"""Building `cuda` candidates with the machine's nvcc (no GPU needed): cache, errors, symbols, entry points."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from commbench_env.judge.coordinator.cuda_build import build, nvcc_version, undefined_symbols

pytestmark = pytest.mark.skipif(not shutil.which("nvcc"), reason="nvcc is not installed")
CUDA_MAJOR = (re.findall(r"cuda_(\d+)\.", nvcc_version()) or ["13"])[0]  # libcudart's soname version

GOOD = r'''
#include "commbench.h"
__global__ void pull(const float* src, float* dst, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) dst[i] = src[i];
}
CB_ENTRY ring_copy(const cb_args* a, cudaStream_t s) {
  const float* src = (const float*)a->peer_in[(a->rank + a->world - 1) % a->world];
  pull<<<(unsigned)((a->count + 255) / 256), 256, 0, s>>>(src, (float*)a->out, a->count);
  return cudaGetLastError() != cudaSuccess;
}
'''


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "src" / "solution.cu"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


def _build(path: Path, cache: Path, **kw):
    args = dict(card_arch="sm_90", links=[], extra_flags=[], functions=["ring_copy"], cache_dir=cache)
    args.update(kw)
    return build(path, **args)


def test_build_then_cache_hit(tmp_path):
    src = _write(tmp_path, GOOD)
    first = _build(src, tmp_path / "cache")
    assert first.ok and not first.cache_hit and not first.violations, first.log
    assert Path(first.library).is_file()
    assert any("registers" in ln for ln in first.ptxas)
    t0 = time.monotonic()
    again = _build(src, tmp_path / "cache")
    assert again.ok and again.cache_hit and again.library == first.library
    assert time.monotonic() - t0 < 0.5
    changed = _build(_write(tmp_path, GOOD + "\n// edit\n"), tmp_path / "cache")
    assert changed.ok and not changed.cache_hit


def test_compile_error_has_line_number(tmp_path):
    src = _write(tmp_path, GOOD.replace("dst[i] = src[i];", "dst[i] = undefined_name;"))
    res = _build(src, tmp_path / "cache")
    assert not res.ok
    assert "solution.cu(5)" in res.log and "undefined_name" in res.log


def test_missing_entry_point(tmp_path):
    res = _build(_write(tmp_path, GOOD), tmp_path / "cache", functions=["something_else"])
    assert not res.ok and "missing extern" in res.log and "something_else" in res.log


@pytest.mark.parametrize("snippet,symbol", [
    ('extern "C" int ncclAllReduce(const void*, void*, size_t, int, int, void*, void*);\n'
     'CB_ENTRY use_nccl(const cb_args* a, cudaStream_t s) { return ncclAllReduce(a->in, a->out, 1, 0, 0, 0, s); }',
     "ncclAllReduce"),
    ('#include <stdlib.h>\nCB_ENTRY shell(const cb_args* a, cudaStream_t s) { return system("true"); }', "system"),
    ('#include <dlfcn.h>\nCB_ENTRY loader(const cb_args* a, cudaStream_t s) { return dlopen("libnccl.so", 0) != 0; }',
     "dlopen"),
    # the driver's entry points would hand out cuStreamCreate, which makes a stream the judge's marks do not order
    ('CB_ENTRY driver(const cb_args* a, cudaStream_t s) { void* f; cudaDriverEntryPointQueryResult q;\n'
     '  return cudaGetDriverEntryPoint("cuStreamCreate", &f, cudaEnableDefault, &q); }', "cudaGetDriverEntryPoint"),
    # a versioned reference past the judge's own stream constructors, to the runtime's non-blocking ones
    (f'__asm__(".symver real_create, cudaStreamCreateWithFlags@libcudart.so.{CUDA_MAJOR}");\n'
     'extern "C" cudaError_t real_create(cudaStream_t*, unsigned int);\n'
     'CB_ENTRY side(const cb_args* a, cudaStream_t s) { cudaStream_t q; return real_create(&q, 1); }',
     "cudaStreamCreateWithFlags"),
])
def test_forbidden_symbols(tmp_path, snippet, symbol):
    res = _build(_write(tmp_path, GOOD + snippet), tmp_path / "cache")
    assert res.ok
    assert any(symbol in v["detail"] for v in res.violations), res.violations


def test_streams_the_candidate_creates_are_made_by_the_judge(tmp_path):
    """A candidate asking for a non-blocking stream gets the judge's blocking one: its calls to the runtime's
    stream constructors bind inside the library (cuda/blocking_streams.cpp), so nothing it imports makes a
    non-blocking stream. Whether the streams then wait for the gate is checked on GPUs
    (benchmarks/gpu_stream_checks.py, tests/attacks/cuda/side_stream_push.cu)."""
    side = GOOD.replace("pull<<<(unsigned)((a->count + 255) / 256), 256, 0, s>>>",
                        "cudaStream_t mine, urgent;\n  cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking);\n"
                        "  cudaStreamCreateWithPriority(&urgent, cudaStreamNonBlocking, -1);\n"
                        "  pull<<<(unsigned)((a->count + 255) / 256), 256, 0, mine>>>")
    res = _build(_write(tmp_path, side), tmp_path / "cache")
    assert res.ok and not res.violations, res.log
    imported = set(undefined_symbols(Path(res.library)))
    assert "cudaStreamCreate" in imported  # what the judge's constructors call
    assert not imported & {"cudaStreamCreateWithFlags", "cudaStreamCreateWithPriority"}
    local = subprocess.run(["nm", res.library], capture_output=True, text=True, check=True).stdout
    assert re.search(r" t cudaStreamCreateWithFlags$", local, re.M), local  # defined, hidden


def test_a_candidate_cannot_define_the_stream_constructors_itself(tmp_path):
    own = GOOD + ('extern "C" cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int f) '
                  '{ return cudaStreamCreate(s); }\n')
    res = _build(_write(tmp_path, own), tmp_path / "cache")
    assert not res.ok and "cudaStreamCreateWithFlags" in res.log, res.log


def test_nccl_allowed_when_the_card_links_it():
    from commbench_env.judge.coordinator.cuda_build import check_symbols

    assert check_symbols(["ncclAllReduce", "cudaMemcpyAsync"], links=["nccl"]) == []
    assert check_symbols(["ncclAllReduce"], links=[])
    assert check_symbols(["dlopen"], links=["nccl"])  # loaders stay forbidden whatever the card links


def test_ptxas_lines_are_separated(tmp_path):
    res = _build(_write(tmp_path, GOOD), tmp_path / "cache")
    assert "ptxas" not in res.log
    assert any("spill" in ln for ln in res.ptxas)


def test_ctypes_mirror_of_cb_args_matches_the_header(tmp_path):
    """The device host fills `cb_args` through a ctypes mirror: a field out of place would hand every candidate
    wrong pointers. sizeof and offsetof as nvcc's host compiler lays the struct out (a host program: no GPU)."""
    from commbench_env.judge.coordinator.cuda_build import HEADER_DIR
    from commbench_env.judge.candidate.device_host import CbArgs

    names = [name for name, _ in CbArgs._fields_]
    prints = "".join(f'  printf("%zu\\n", offsetof(cb_args, {"in" if n == "in_" else n}));\n' for n in names)
    src = tmp_path / "layout.cu"
    src.write_text('#include <cstddef>\n#include <cstdio>\n#include "commbench.h"\n'
                   f'int main() {{\n  printf("%zu\\n", sizeof(cb_args));\n{prints}  return 0;\n}}\n')
    exe = tmp_path / "layout"
    subprocess.run(["nvcc", f"-I{HEADER_DIR}", "-o", str(exe), str(src)], check=True, capture_output=True, timeout=300)
    c_layout = [int(x) for x in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()]
    assert c_layout == [ctypes.sizeof(CbArgs), *(getattr(CbArgs, n).offset for n in names)]
