"""Build a `cuda` candidate: nvcc into a shared library, cached by content, with its undefined symbols checked.

Runs in the coordinator (never in a candidate process). The compile log (errors with line numbers, warnings,
`-Xptxas -v` register and spill lines) is the agent's feedback. The architecture comes from the GPU
(`nvidia-smi`, which does not initialise CUDA in this process) or, without a GPU, from the card.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from ...paths import CUDA_HEADER_DIR

HEADER_DIR = CUDA_HEADER_DIR  # judge/cuda: compiled into every candidate library
BASE_FLAGS = ["-O3", "-lineinfo", "-Xptxas", "-v", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "-cudart=shared"]
# Linked into every candidate: the streams it creates are blocking, so the judge's marks on the legacy default
# stream order them (see the file's comment and DeviceHost.call_all).
BLOCKING_STREAMS = HEADER_DIR / "blocking_streams.cpp"

# What a candidate library may import (its undefined dynamic symbols, `nm -D --undefined-only`) is an ALLOWLIST:
# the names below, the families of the libraries its card links ([cuda] links) and its card's own additions
# ([cuda] allow_symbols). Anything else is a `forbidden_symbol`: a blocklist missed raw syscall(), ELF self-lookup
# (dl_iterate_phdr) reaching NCCL or the driver, __libc_*/__fork aliases, mprotect, write() to the judge's socket.
# Exact names wherever a family is not clearly safe: the `__cuda` and `_ZNSt` namespaces, for instance, also hold
# __cudaGetProcAddress (the runtime's own proc-address lookup) and std::thread / std::filesystem / std::basic_filebuf.
# (Native code can still walk memory without importing anything; seccomp and Landlock in the rank are the boundary,
# this check keeps the easy routes out and tells an honest kernel what it may use.)
ALLOWED_SYMBOLS = frozenset({
    # nvcc's registration and launch stubs (crt/host_runtime.h; CUDA 12's stubs call cudaLaunchKernel itself)
    "__cudaRegisterFatBinary", "__cudaRegisterFatBinaryEnd", "__cudaUnregisterFatBinary", "__cudaRegisterFunction",
    "__cudaRegisterVar", "__cudaRegisterManagedVar", "__cudaInitModule", "__cudaPushCallConfiguration",
    "__cudaPopCallConfiguration", "__cudaLaunchKernel", "__cudaGetKernel",
    # launches on the caller's streams
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cudaLaunchCooperativeKernel",
    # streams and events: the judge's blocking-stream shim calls cudaStreamCreate (cuda/blocking_streams.cpp)
    "cudaStreamCreate", "cudaStreamDestroy", "cudaStreamWaitEvent", "cudaStreamGetFlags", "cudaStreamGetPriority",
    "cudaStreamGetDevice", "cudaEventCreate", "cudaEventCreateWithFlags", "cudaEventRecord",
    "cudaEventRecordWithFlags", "cudaEventDestroy", "cudaEventElapsedTime",
    # copies and fills enqueued on a stream (never the synchronous cudaMemcpy/cudaMemset: they order the legacy
    # stream against the judge's gate from the host), __device__/__constant__ symbols
    "cudaMemcpyAsync", "cudaMemcpyPeerAsync", "cudaMemcpy2DAsync", "cudaMemcpy3DAsync", "cudaMemcpy3DPeerAsync",
    "cudaMemsetAsync", "cudaMemset2DAsync", "cudaMemset3DAsync", "cudaMemcpyToSymbolAsync",
    "cudaMemcpyFromSymbolAsync", "cudaGetSymbolAddress", "cudaGetSymbolSize",
    # queries: errors, device and pointer attributes, kernel attributes, occupancy, versions
    "cudaGetLastError", "cudaPeekAtLastError", "cudaGetErrorString", "cudaGetErrorName", "cudaGetDevice",
    "cudaGetDeviceCount", "cudaDeviceGetAttribute", "cudaGetDeviceProperties", "cudaGetDeviceProperties_v2",
    "cudaDeviceCanAccessPeer", "cudaDeviceGetP2PAttribute", "cudaPointerGetAttributes",
    "cudaDeviceGetStreamPriorityRange", "cudaRuntimeGetVersion", "cudaDriverGetVersion", "cudaFuncGetAttributes",
    "cudaFuncSetAttribute", "cudaFuncSetCacheConfig", "cudaOccupancyMaxActiveBlocksPerMultiprocessor",
    "cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags", "cudaOccupancyAvailableDynamicSMemPerBlock",
    "cudaOccupancyMaxPotentialClusterSize", "cudaOccupancyMaxActiveClusters",
    # the toolchain's own start-up files (crtbegin: transactional-memory clones, gprof, C++ static destructors)
    "_ITM_deregisterTMCloneTable", "_ITM_registerTMCloneTable", "__gmon_start__", "__cxa_finalize",
    # libgcc unwinding, thread_local, std::call_once / std::mutex, shared_ptr's single-thread test, errno
    "_Unwind_Resume", "__gxx_personality_v0", "__gcc_personality_v0", "__tls_get_addr", "__once_proxy",
    "pthread_once", "pthread_mutex_lock", "pthread_mutex_trylock", "pthread_mutex_unlock", "__pthread_key_create",
    "__libc_single_threaded", "__errno_location",
    # libc: memory, strings, number parsing, formatting to stdout/stderr (files the judge opened), assert/abort
    "malloc", "calloc", "realloc", "free", "aligned_alloc", "posix_memalign", "memcpy", "memmove", "memset",
    "memcmp", "memchr", "strlen", "strnlen", "strcmp", "strncmp", "strcpy", "strncpy", "strcat", "strncat", "strchr",
    "strrchr", "strstr", "strtol", "strtoul", "strtoll", "strtoull", "strtod", "strtof", "atoi", "atol", "atoll",
    "atof", "abs", "labs", "llabs", "qsort", "bsearch", "sscanf", "__isoc99_sscanf", "__isoc23_sscanf",
    "__isoc23_strtol", "__isoc23_strtoul", "__isoc23_strtoll", "__isoc23_strtoull", "printf", "fprintf",
    "sprintf", "snprintf", "vprintf", "vfprintf", "vsprintf", "vsnprintf", "puts", "putchar", "fputs", "fputc",
    "putc", "fwrite", "fflush", "stdout", "stderr", "abort", "__assert_fail",
    # _FORTIFY_SOURCE and -fstack-protector, which Ubuntu's gcc turns on by default (NGC images)
    "__stack_chk_fail", "__printf_chk", "__fprintf_chk", "__sprintf_chk", "__snprintf_chk", "__vprintf_chk",
    "__vfprintf_chk", "__vsprintf_chk", "__vsnprintf_chk", "__memcpy_chk", "__memmove_chk", "__memset_chk",
    "__strcpy_chk", "__strncpy_chk", "__strcat_chk", "__strncat_chk", "__stpcpy_chk",
})
ALLOWED_SYMBOL_FAMILIES = re.compile("|".join(f"(?:{p})" for p in (
    r"__cxa_\w+",  # the C++ ABI runtime: guards, atexit, exceptions, demangling (libstdc++/libc); no I/O
    r"_Z(?:nw|na|dl|da)\w+",  # global operator new / new[] / delete / delete[] (every overload)
    # libm (and glibc's old -ffast-math __*_finite entry points): pure functions of their arguments
    r"(?:__)?(?:sqrt|cbrt|exp|exp2|exp10|expm1|log|log2|log10|log1p|pow|sin|cos|tan|sincos|asin|acos|atan|atan2|"
    r"sinh|cosh|tanh|asinh|acosh|atanh|erf|erfc|tgamma|lgamma|ceil|floor|round|lround|llround|trunc|rint|lrint|"
    r"llrint|nearbyint|fmod|remainder|remquo|fma|fmax|fmin|fdim|hypot|frexp|ldexp|modf|scalbn|scalbln|ilogb|logb|"
    r"nextafter|nexttoward|copysign|fabs|nan)[fl]?(?:_finite)?",
    # libstdc++, family by family (not the whole std namespace: std::thread, std::filesystem and file streams are
    # in it): the out-of-line __throw_* helpers, map/set and list/unordered_* node code, std::string and string
    # streams, iostreams on cout/cerr, the standard exceptions, exception_ptr, type_info, std::chrono clocks
    r"_ZSt\d+__throw_\w+", r"_ZSt9terminatev", r"_ZSt\d+uncaught_exceptions?v", r"_ZSt\d+_Rb_tree_\w+",
    r"_ZNK?St8__detail\d+_(?:List_node_base|Prime_rehash_policy)\w+",
    r"_ZNK?St7__cxx11\d+basic_(?:string|stringbuf|ostringstream|istringstream|stringstream)I\w+",
    r"_ZSt4(?:cout|cerr|clog)", r"_ZNK?S[oi]\w+", r"_ZSt(?:ls|rs)\w+", r"_ZSt\d+__ostream_insert\w+",
    r"_ZSt4endl\w+", r"_ZNK?St8ios_base\w+", r"_ZNK?St9basic_ios\w+", r"_ZNK?St15basic_streambuf\w+",
    r"_ZNSt6locale(?:C[12]Ev|C[12]ERKS_|D[12]Ev|7classicEv)", r"_ZNK?St5ctype\w+",  # not named locales
    r"_ZNK?St\d+(?:exception|bad_alloc|bad_array_new_length|bad_cast|bad_typeid|bad_function_call|logic_error|"
    r"domain_error|invalid_argument|length_error|out_of_range|runtime_error|range_error|overflow_error|"
    r"underflow_error|system_error|nested_exception|__exception_ptr|type_info)\w*",
    r"_ZSt\d+(?:current_exception|rethrow_exception)\w*", r"_ZNSt3_V2\d+(?:system|generic)_categoryEv",
    r"_ZSt\d+(?:system|generic)_categoryv", r"_ZSt11__once_call", r"_ZSt15__once_callable",
    r"_ZNSt6chrono3_V212(?:steady|system)_clock3nowEv",
    # type_info objects, their names, vtables and VTTs of std and C++-ABI classes (data, no code to call)
    r"_ZT[ISVT]N?St\w+", r"_ZT[ISV]N10__cxxabiv1\w+",
)))
# The families a card's [cuda] links bring in (their documented prefixes).
LIBRARY_SYMBOLS = {"nccl": re.compile(r"^nccl"), "nvshmem": re.compile(r"^nvshmem"),
                   # MPI_COMM_WORLD and the predefined datatypes are Open MPI's ompi_mpi_* objects
                   "mpi": re.compile(r"^(P?MPI_|ompi_mpi_)"), "cublas": re.compile(r"^cublas"),
                   # the driver API, and the runtime's ways to its entry points (cuStreamCreate makes any stream)
                   "cuda": re.compile(r"^(cu[A-Z]|cudaGetDriverEntryPoint|__cudaGetProcAddress)")}
# Never, whatever the card allows or links: loaders, processes, files, sockets, and the judge's own stream
# constructors (BLOCKING_STREAMS defines them inside the library: an import means its calls were routed past them).
NEVER_SYMBOLS = re.compile(
    r"^(dlopen|dlmopen|dlsym|dlvsym|system|popen|fork|vfork|execv\w*|execl\w*|posix_spawn\w*|socket|connect|"
    r"bind|fopen\w*|open|open64|openat\w*|creat\w*|shm_open|mmap\w*|ptrace|kill|prctl|setrlimit|"
    r"cuMemExportToShareableHandle|cudaStreamCreateWithFlags|cudaStreamCreateWithPriority)$")
ALLOW_HINT = ("a `cuda` candidate may import the CUDA runtime's launch, stream/event, async copy/memset and query "
              "functions, the C/C++ standard library's memory, string, formatting and maths functions, and the "
              "libraries its card links; remove the call (or what pulls it in); if a task really needs it, its card "
              "must list it in [cuda] allow_symbols")


@dataclass
class BuildResult:
    ok: bool
    library: str = ""
    log: str = ""
    ptxas: list[str] = field(default_factory=list)
    violations: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    cache_hit: bool = False
    arch: str = ""
    command: str = ""


@lru_cache(maxsize=1)
def nvcc_version() -> str:
    nvcc = shutil.which("nvcc")
    if not nvcc:
        return ""
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    return out.strip().splitlines()[-1] if out.strip() else "nvcc"


@lru_cache(maxsize=1)
def detected_arch() -> str | None:
    """sm_XY of the first GPU, from nvidia-smi (no CUDA context in this process)."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return None
    if not out:
        return None
    major, _, minor = out[0].partition(".")
    arch = f"sm_{major}{minor}"
    return arch + "a" if arch == "sm_90" else arch  # Hopper-only instructions (wgmma, TMA) need sm_90a


def _clean_log(text: str, workdir: Path) -> tuple[str, list[str]]:
    lines, ptxas = [], []
    for line in text.splitlines():
        line = line.replace(str(workdir) + "/", "")
        if line.startswith("ptxas info") or (line.startswith("    ") and "bytes stack frame" in line):
            if "Used" in line or "spill" in line or "Compiling entry" in line:
                ptxas.append(line.strip())
        elif line.strip():
            lines.append(line)
    return "\n".join(lines), ptxas


def undefined_symbols(library: Path) -> list[str]:
    """The dynamic symbols `library` imports, without their versions (`memcpy@GLIBC_2.14` -> `memcpy`)."""
    nm = shutil.which("nm")
    if not nm:
        raise RuntimeError("nm (binutils) is not installed: the library's imports cannot be checked")
    out = subprocess.run([nm, "-D", "--undefined-only", str(library)], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"nm could not read the library: {out.stderr.strip()[:300]}")
    return [ln.split()[-1].split("@")[0] for ln in out.stdout.splitlines() if ln.strip()]


def _card_allows(sym: str, allow: list[str] | tuple[str, ...]) -> bool:
    """[cuda] allow_symbols: exact names, or `prefix*`."""
    return any(sym == a or (a.endswith("*") and sym.startswith(a[:-1])) for a in allow)


def check_symbols(symbols: list[str], links: list[str], allow: list[str] | tuple[str, ...] = ()) -> list[dict]:
    """One `forbidden_symbol` violation per imported symbol that neither the defaults, the card's links nor its
    allow_symbols allow (NEVER_SYMBOLS whatever they say)."""
    violations = []
    for sym in dict.fromkeys(symbols):
        detail = None
        if NEVER_SYMBOLS.match(sym):
            detail = f"the library imports {sym!r}, which candidate code may not use, whatever the card allows"
        elif sym in ALLOWED_SYMBOLS or ALLOWED_SYMBOL_FAMILIES.fullmatch(sym) or _card_allows(sym, allow):
            continue
        else:
            lib = next((name for name, pattern in LIBRARY_SYMBOLS.items() if pattern.match(sym)), None)
            if lib in links:
                continue
            if lib:
                detail = (f"the library calls {sym!r} from {lib}, which this task does not allow "
                          f"(its card's [cuda] links does not list {lib!r})")
            else:
                detail = f"the library imports {sym!r}, which no task allows by default: {ALLOW_HINT}"
        violations.append({"rule": "forbidden_symbol", "where": "static", "detail": detail})
    return violations


def _violations(library: Path, links: list[str], allow: list[str] | tuple[str, ...]) -> list[dict]:
    try:
        return check_symbols(undefined_symbols(library), links, allow)
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:  # unchecked is refused, not let through
        return [{"rule": "forbidden_symbol", "where": "static",
                 "detail": f"the library's imports were not checked: {exc}"}]


def build(source_path: Path, *, card_arch: str, links: list[str], extra_flags: list[str], functions: list[str],
          cache_dir: Path, timeout_s: float = 120.0, allow_symbols: list[str] | tuple[str, ...] = ()) -> BuildResult:
    """Compile `source_path` (a .cu file) into a shared library, or return the cached one. Its imports are
    checked on every call (cache hits too), against the defaults, `links` and `allow_symbols` ([cuda] of the card)."""
    t0 = time.monotonic()
    nvcc = shutil.which("nvcc")
    if not nvcc:
        return BuildResult(ok=False, log="nvcc is not installed in this sandbox: CUDA tasks cannot be built here")
    arch = detected_arch() or card_arch
    source = source_path.read_bytes()
    flags = [*BASE_FLAGS, f"-arch={arch}", f"-I{HEADER_DIR}", *extra_flags, *[f"-l{lib}" for lib in links]]
    key = hashlib.sha256(b"\0".join([source, " ".join(flags).encode(), nvcc_version().encode(),
                                     (HEADER_DIR / "commbench.h").read_bytes(),
                                     BLOCKING_STREAMS.read_bytes()])).hexdigest()[:24]
    entry = cache_dir / key
    lib = entry / "candidate.so"
    if lib.is_file() and (entry / "log.txt").is_file():
        log = (entry / "log.txt").read_text()
        text, ptxas = _clean_log(log, source_path.parent)
        return BuildResult(ok=True, library=str(lib), log=text, ptxas=ptxas, cache_hit=True, arch=arch,
                           seconds=time.monotonic() - t0, violations=_violations(lib, links, allow_symbols))
    streams_obj = _blocking_streams_object(nvcc, cache_dir, timeout_s)
    if isinstance(streams_obj, BuildResult):
        return streams_obj
    tmp = cache_dir / f".{key}.{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    cmd = [nvcc, *flags, "-o", str(tmp / "candidate.so"), source_path.name, str(streams_obj)]
    try:
        proc = subprocess.run(cmd, cwd=source_path.parent, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        shutil.rmtree(tmp, ignore_errors=True)
        return BuildResult(ok=False, log=f"nvcc did not finish within {timeout_s:.0f} s", arch=arch)
    text, ptxas = _clean_log(proc.stdout + proc.stderr, source_path.parent)
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        return BuildResult(ok=False, log=text or f"nvcc exited with code {proc.returncode}", ptxas=ptxas, arch=arch,
                           seconds=time.monotonic() - t0, command=" ".join(cmd))
    (tmp / "log.txt").write_text(proc.stdout + proc.stderr)
    violations = _violations(tmp / "candidate.so", links, allow_symbols)
    exported = set(_exported(tmp / "candidate.so"))
    missing = [f for f in functions if f not in exported]
    if missing:
        shutil.rmtree(tmp, ignore_errors=True)
        return BuildResult(ok=False, arch=arch, seconds=time.monotonic() - t0, ptxas=ptxas,
                           log=(text + "\n" if text else "") + f"{source_path.name}: missing extern \"C\" entry "
                               f"point(s): {', '.join(missing)} (declare them as: CB_ENTRY name(const cb_args* args, "
                               f"cudaStream_t stream))")
    if entry.exists():
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        tmp.rename(entry)
    return BuildResult(ok=True, library=str(entry / "candidate.so"), log=text, ptxas=ptxas, violations=violations,
                       seconds=time.monotonic() - t0, arch=arch, command=" ".join(cmd))


def _blocking_streams_object(nvcc: str, cache_dir: Path, timeout_s: float) -> Path | BuildResult:
    """BLOCKING_STREAMS compiled once per cache (host code only: a fraction of a second), reused by every build."""
    key = hashlib.sha256(BLOCKING_STREAMS.read_bytes() + nvcc_version().encode()).hexdigest()[:16]
    obj = cache_dir / f"blocking_streams-{key}.o"
    if obj.is_file():
        return obj
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = obj.with_name(f".{obj.name}.{os.getpid()}")
    proc = subprocess.run([nvcc, "-c", "-O2", "-Xcompiler", "-fPIC", "-o", str(tmp), str(BLOCKING_STREAMS)],
                          capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        return BuildResult(ok=False, log=f"the judge's own stream shim did not compile (a broken CUDA toolkit?):\n"
                                         f"{proc.stdout}{proc.stderr}")
    tmp.rename(obj)
    return obj


def _exported(library: Path) -> list[str]:
    nm = shutil.which("nm")
    if not nm:
        return []
    out = subprocess.run([nm, "-D", "--defined-only", str(library)], capture_output=True, text=True, timeout=60)
    return [ln.split()[-1] for ln in out.stdout.splitlines() if " T " in ln]
