"""What a `cuda` candidate library may import: an allowlist (judge/coordinator/cuda_build.py), checked on real nvcc builds.

Every task reference and starter builds with no `forbidden_symbol`; every attack in tests/attacks/cuda/symbols/
(`EXPECT: forbidden_symbol NAME ...`) is refused for each NAME; all of them went through the old blocklist. They
sit in a folder of their own: the .cu files directly in tests/attacks/cuda/ are GPU attacks that must get through
the build (tests/test_cuda_tasks.py, benchmarks/gpu_stream_checks.py). The builds share one cache under the test
cache folder, so a second run only lists imports (no GPU is needed).
"""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from commbench_env.cards import CudaSpec, load_all_tasks
from commbench_env.judge.coordinator import cuda_build
from commbench_env.judge.coordinator.cuda_build import build, check_symbols, undefined_symbols
from commbench_env.paths import cache_dir

from .conftest import ATTACKS

needs_nvcc = pytest.mark.skipif(not (shutil.which("nvcc") and shutil.which("nm")),
                                reason="nvcc or nm is not installed: nothing can be built here")
CUDA_TASKS = [t for t in load_all_tasks() if t.card.language.value == "cuda"]
SOURCES = {f"{t.id}:{which}": t for t in CUDA_TASKS for which in ("reference", "starter")}
SYMBOL_ATTACKS = sorted(ATTACKS.glob("cuda/symbols/*.cu"))


def _header(path: Path, key: str) -> str:
    return next((ln.split(":", 1)[1].strip() for ln in path.read_text().splitlines() if ln.startswith(f"// {key}:")),
                "")


REFUSED = [p for p in SYMBOL_ATTACKS if _header(p, "EXPECT").startswith("forbidden_symbol")]

# Host code an honest kernel's launcher may well contain: it must build with no violation on the defaults.
HONEST_HOST_CODE = r'''
#include "commbench.h"
#include <cooperative_groups.h>
#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>
namespace cg = cooperative_groups;
__device__ int dev_counter;
__managed__ int managed_counter;
__constant__ float coeffs[16];
__global__ void k(float* p, int n) { cg::this_grid().sync(); if (threadIdx.x == 0) printf("n %d\n", n);
  assert(n > 0); p[threadIdx.x] = coeffs[0] + dev_counter + managed_counter + sinf(p[0]) + __expf(p[1]); }
__global__ void __cluster_dims__(2, 1, 1) kc(float* p) { p[0] = 1; }
static std::mutex mu;
static std::once_flag once;
thread_local int calls = 0;
struct Plan { std::vector<int> v; std::string name; std::unordered_map<int, int> m; std::map<int, int> mm;
              std::list<int> l; };
CB_ENTRY honest(const cb_args* a, cudaStream_t s) {
  static Plan plans[CB_MAX_RANKS];
  std::lock_guard<std::mutex> g(mu);
  std::call_once(once, [] { calls = 0; });
  calls++;
  Plan& pl = plans[a->rank];
  pl.v.resize(a->world); pl.name = "rank" + std::to_string(a->rank); pl.m[a->rank] = 1; pl.mm[a->rank] = 2;
  pl.l.push_back(a->rank);
  std::sort(pl.v.begin(), pl.v.end());
  auto up = std::make_unique<int[]>(a->params[0] + 1); std::shared_ptr<int> sp = std::make_shared<int>(3);
  if (a->count < 0) throw std::invalid_argument("negative count " + std::to_string(a->count));
  try { if (a->world > 8) throw std::runtime_error("too many ranks"); }
  catch (const std::exception& e) { std::cerr << e.what() << std::endl; return 1; }
  std::ostringstream os; os << "rank " << a->rank << " count " << a->count;
  if (a->rank == 1234) std::cout << os.str() << "\n";
  double x = std::sqrt((double)a->count) + std::log((double)a->world) + std::exp(0.5 * a->rank)
           + std::pow((double)a->world, 1.5) + std::floor(a->count / 3.0) + std::tanh(1.0 * a->rank);
  char buf[64]; snprintf(buf, (size_t)a->params[1] & 63, "%f", x); memcpy(buf, a->params, (size_t)a->params[2] & 31);
  printf("%s %zu\n", buf, strlen(buf)); fprintf(stderr, "%d\n", atoi(buf) + (int)strtol(buf, nullptr, 10));
  float* host = (float*)malloc((size_t)a->params[3]); if (!host) abort(); host[0] = (float)x; free(host);
  int dev; cudaGetDevice(&dev);
  cudaDeviceProp prop; cudaGetDeviceProperties(&prop, dev);
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  int blocks; cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, k, 256, 0);
  int mg, bs; cudaOccupancyMaxPotentialBlockSize(&mg, &bs, k, 0, 0);
  cudaFuncAttributes fa; cudaFuncGetAttributes(&fa, k);
  cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 1 << 16);
  float c[16] = {0}; cudaMemcpyToSymbolAsync(coeffs, c, sizeof c, 0, cudaMemcpyHostToDevice, s);
  void* sym; cudaGetSymbolAddress(&sym, dev_counter);
  cudaPointerAttributes pa; cudaPointerGetAttributes(&pa, a->in);
  int can; cudaDeviceCanAccessPeer(&can, dev, (dev + 1) % 2);
  cudaMemsetAsync(a->out, 0, 16, s);
  cudaMemcpyAsync(a->out, a->in, 16, cudaMemcpyDeviceToDevice, s);
  cudaMemcpyPeerAsync(a->out, dev, a->in, dev, 16, s);
  cudaMemcpy2DAsync(a->out, 16, a->in, 16, 16, 1, cudaMemcpyDefault, s);
  cudaEvent_t e; cudaEventCreateWithFlags(&e, cudaEventDisableTiming); cudaEventRecord(e, s);
  cudaStream_t side; cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking); cudaStreamWaitEvent(side, e, 0);
  kc<<<2, 32, 0, side>>>((float*)a->out);
  cudaEventRecord(e, side); cudaStreamWaitEvent(s, e, 0); cudaEventDestroy(e); cudaStreamDestroy(side);
  float* p = (float*)a->out; int n = 4; void* args[] = {&p, &n};
  cudaLaunchCooperativeKernel((void*)k, 1, 32, args, 0, s);
  cudaLaunchConfig_t cfg = {}; cfg.gridDim = 2; cfg.blockDim = 32; cfg.stream = s;
  cudaLaunchKernelEx(&cfg, kc, (float*)a->out);
  cudaError_t err = cudaPeekAtLastError();
  if (err != cudaSuccess) { fprintf(stderr, "%s: %s\n", cudaGetErrorName(err), cudaGetErrorString(err)); return 1; }
  return cudaGetLastError() != cudaSuccess;
}
'''


def _build(key: str, text: str, card, root: Path, *, functions=None, extra_flags=(), allow=()):
    src = root / "src" / key.replace("/", "_").replace(":", "_") / card.entry.file
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_text(text)
    return build(src, card_arch=card.cuda.arch, links=card.cuda.links,
                 extra_flags=[*card.cuda.nvcc_flags, *extra_flags],
                 functions=card.entry.functions if functions is None else functions,
                 cache_dir=cache_dir() / "cuda-symbol-tests", allow_symbols=list(allow))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Every task reference and starter and every symbol attack, built once (in parallel, through the shared
    cache)."""
    if not (shutil.which("nvcc") and shutil.which("nm")):
        pytest.skip("nvcc or nm is not installed: nothing can be built here")
    root = tmp_path_factory.mktemp("symbols")
    push = next(t for t in CUDA_TASKS if t.id == "p2p/ipc_push_copy")
    jobs = {key: ((t.reference_source() if key.endswith(":reference") else t.starter), t.card)
            for key, t in SOURCES.items()}
    jobs.update({f"attack:{p.name}": (p.read_text(), push.card) for p in SYMBOL_ATTACKS})
    first = next(iter(jobs))
    results = {first: _build(first, *jobs[first], root)}  # compiles the judge's stream shim once, alone

    def same(text, card):  # what decides a build's result: two threads never write one cache entry
        return text, card.cuda.arch, tuple(card.cuda.links), tuple(card.cuda.nvcc_flags), tuple(card.entry.functions)

    seen: dict[tuple, str] = {}
    for key, job in jobs.items():
        seen.setdefault(same(*job), key)
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {key: pool.submit(_build, key, *jobs[key], root) for key in seen.values() if key not in results}
        results.update({key: f.result() for key, f in futures.items()})
    return {key: results[seen[same(*job)]] for key, job in jobs.items()}


@needs_nvcc
@pytest.mark.parametrize("key", sorted(SOURCES))
def test_task_sources_import_only_allowed_symbols(built, key):
    res = built[key]
    assert res.ok, res.log
    assert not res.violations, f"{key}: {[v['detail'] for v in res.violations]}"


@needs_nvcc
@pytest.mark.parametrize("path", REFUSED, ids=lambda p: p.name)
def test_attack_imports_are_refused(built, path):
    res = built[f"attack:{path.name}"]
    assert res.ok, res.log  # it compiles: the symbol check, not nvcc, refuses it
    expected = _header(path, "EXPECT").split()[1:]
    assert expected, f"{path.name}: name the symbols after `EXPECT: forbidden_symbol`"
    imported = set(undefined_symbols(Path(res.library)))
    for sym in expected:
        assert sym in imported, f"{path.name} does not import {sym}"
        hits = [v for v in res.violations if v["rule"] == "forbidden_symbol" and f"{sym!r}" in v["detail"]]
        assert hits, f"{path.name}: {sym} was let through: {res.violations}"
    assert all(v["where"] == "static" for v in res.violations)


def test_attack_folder_has_symbol_attacks():
    assert REFUSED == SYMBOL_ATTACKS  # each names what it must be refused for
    names = {p.name for p in REFUSED}
    assert len(names) >= 4
    assert {"raw_syscall.cu", "phdr_self_lookup.cu", "mprotect_patch.cu", "libc_aliases.cu"} <= names


@needs_nvcc
def test_a_card_can_allow_what_the_defaults_refuse(built, tmp_path):
    """[cuda] allow_symbols reaches build(): the same library, checked again (a cache hit), now has no violation."""
    path = ATTACKS / "cuda" / "symbols" / "raw_syscall.cu"
    card = next(t for t in CUDA_TASKS if t.id == "p2p/ipc_push_copy").card
    res = _build("allowed", path.read_text(), card, tmp_path, allow=["syscall"])
    assert res.ok and res.cache_hit and not res.violations, res.violations
    assert _build("prefix", path.read_text(), card, tmp_path, allow=["sysc*"]).violations == []


@needs_nvcc
def test_honest_host_code_builds_on_the_defaults(tmp_path):
    """Containers, strings, iostreams, exceptions, call_once/mutex, thread_local, libm, printf, __device__/
    __managed__/__constant__ symbols, occupancy, cooperative and cluster launches, async copies, events."""
    card = next(t for t in CUDA_TASKS if t.id == "p2p/ipc_push_copy").card
    for flags in ([], ["-Xcompiler", "-D_FORTIFY_SOURCE=3", "-Xcompiler", "-fstack-protector-strong"]):  # Ubuntu's
        res = _build("honest", HONEST_HOST_CODE, card, tmp_path, functions=["honest"], extra_flags=flags)
        assert res.ok, res.log
        assert not res.violations, [v["detail"] for v in res.violations]


def test_unknown_symbols_are_refused_with_what_to_do():
    (v,) = check_symbols(["syscall"], links=[])
    assert v["rule"] == "forbidden_symbol" and v["where"] == "static"
    assert "'syscall'" in v["detail"] and "no task allows" in v["detail"]
    assert "[cuda] allow_symbols" in v["detail"]


@pytest.mark.parametrize("sym", [
    "syscall", "dl_iterate_phdr", "_r_debug", "mprotect", "write", "getenv", "pthread_create", "__libc_system",
    "__libc_dlopen_mode", "__fork", "_Fork", "clone", "__open64", "__open_2", "fdopen", "ioctl", "sendmsg",
    # the runtime's way to any entry point, its private tables, per-thread-stream variants
    "__cudaGetProcAddress", "cudaGetExportTable", "__cudaLaunchKernel_ptsz", "cudaMemcpyAsync_ptsz",
    # the judge allocates every buffer and owns the device: no allocation, device-wide sync or host-blocking copy
    "cudaMalloc", "cudaMallocAsync", "cudaMallocManaged", "cudaFree", "cudaHostAlloc", "cudaMallocHost",
    "cudaHostRegister", "cudaDeviceSynchronize", "cudaDeviceReset", "cudaSetDevice", "cudaMemcpy", "cudaMemset",
    "cudaStreamSynchronize", "cudaLaunchHostFunc", "cudaIpcOpenMemHandle", "cudaDeviceEnablePeerAccess",
    "cudaGraphLaunch", "cudaLibraryLoadFromFile",
    # libstdc++ outside the allowed families: threads, files, file descriptors, the file system
    "_ZNSt6thread15_M_start_threadESt10unique_ptrINS_6_StateESt14default_deleteIS1_EEPFvvE",
    "_ZNSt13basic_filebufIcSt11char_traitsIcEE4openEPKcSt13_Ios_Openmode", "_ZNSt12__basic_fileIcE8sys_openEii",
    "_ZNSt10filesystem6removeERKNS_4pathE",
    "_ZNSt13random_device7_M_initERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE",
    "_ZNSt6localeC1EPKc",
])
def test_symbols_outside_the_allowlist(sym):
    assert check_symbols([sym], links=[]), f"{sym} is allowed by default"


@pytest.mark.parametrize("sym", [
    "__cudaRegisterFatBinary", "__cudaLaunchKernel", "cudaLaunchKernel", "cudaStreamCreate", "cudaMemcpyAsync",
    "memcpy", "__memcpy_chk", "__stack_chk_fail", "_Znwm", "_ZdlPvm", "__cxa_throw", "_Unwind_Resume", "expf",
    "__exp_finite", "sincosf", "_ZSt20__throw_length_errorPKc",
    "_ZNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEE9_M_createERmm", "_ZSt4cerr", "_ZTISt13runtime_error",
    "_ZTVN10__cxxabiv117__class_type_infoE", "__libc_single_threaded",
])
def test_symbols_in_the_allowlist(sym):
    assert check_symbols([sym], links=[]) == []


def test_linked_libraries_bring_their_prefixes():
    assert check_symbols(["ncclAllReduce", "ncclGetErrorString"], links=["nccl"]) == []
    assert check_symbols(["nvshmemx_barrier_all_on_stream"], links=["nvshmem"]) == []
    assert check_symbols(["cuStreamCreate", "cudaGetDriverEntryPoint", "__cudaGetProcAddress"], links=["cuda"]) == []
    (v,) = check_symbols(["ncclAllReduce"], links=["nvshmem"])
    assert "from nccl" in v["detail"] and "[cuda] links" in v["detail"]


def test_some_symbols_no_card_can_allow():
    for sym in ("dlopen", "system", "fork", "execve", "cudaStreamCreateWithFlags", "cuMemExportToShareableHandle"):
        (v,) = check_symbols([sym], links=["cuda", "nccl"], allow=[sym])
        assert "whatever the card allows" in v["detail"]


def test_one_violation_per_symbol():
    assert len(check_symbols(["syscall", "syscall", "memcpy"], links=[])) == 1


def test_unreadable_imports_are_refused(monkeypatch, tmp_path):
    monkeypatch.setattr(cuda_build.shutil, "which", lambda name: None)
    (v,) = cuda_build._violations(tmp_path / "candidate.so", [], [])
    assert v["rule"] == "forbidden_symbol" and "not checked" in v["detail"]


def test_card_allow_symbols_are_symbol_names():
    assert CudaSpec(allow_symbols=["clock_gettime", "cuTensorMap*"]).allow_symbols == ["clock_gettime", "cuTensorMap*"]
    for bad in (["*"], ["a*"], ["clock gettime"], ["ma*lloc"]):
        with pytest.raises(ValueError):
            CudaSpec(allow_symbols=bad)
