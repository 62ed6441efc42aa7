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

HEADER_DIR = Path(__file__).parent / "cuda"
BASE_FLAGS = ["-O3", "-lineinfo", "-Xptxas", "-v", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "-cudart=shared"]
# Linked into every candidate: the streams it creates are blocking, so the judge's marks on the legacy default
# stream order them (see the file's comment and DeviceHost.call_all).
BLOCKING_STREAMS = HEADER_DIR / "blocking_streams.cpp"

# Symbols a candidate library may not import, whatever the card allows: loaders, processes, files, sockets.
ALWAYS_FORBIDDEN_SYMBOLS = re.compile(
    r"^(dlopen|dlmopen|dlsym|dlvsym|system|popen|fork|vfork|execv\w*|execl\w*|posix_spawn\w*|socket|connect|"
    r"bind|fopen\w*|open|open64|openat\w*|creat\w*|shm_open|mmap\w*|ptrace|kill|prctl|setrlimit|cuMemExportToShareableHandle|"
    # the judge's BLOCKING_STREAMS defines these inside the library: an import means its calls were routed past them
    r"cudaStreamCreateWithFlags|cudaStreamCreateWithPriority)$")
# Libraries a card must list in [cuda] links before their symbols may appear.
LIBRARY_SYMBOLS = {"nccl": re.compile(r"^nccl"), "nvshmem": re.compile(r"^nvshmem"), "mpi": re.compile(r"^MPI_"),
                   "cublas": re.compile(r"^cublas"),
                   # the driver API, and the runtime's way to its entry points (cuStreamCreate makes any stream)
                   "cuda": re.compile(r"^(cu[A-Z]|cudaGetDriverEntryPoint)")}


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
    nm = shutil.which("nm")
    if not nm:
        return []
    out = subprocess.run([nm, "-D", "--undefined-only", str(library)], capture_output=True, text=True, timeout=60)
    return [ln.split()[-1].split("@")[0] for ln in out.stdout.splitlines() if ln.strip()]


def check_symbols(symbols: list[str], links: list[str]) -> list[dict]:
    violations = []
    for sym in symbols:
        if ALWAYS_FORBIDDEN_SYMBOLS.match(sym):
            violations.append({"rule": "forbidden_symbol", "where": "static",
                               "detail": f"the library imports {sym!r}, which candidate code may not use"})
            continue
        for lib, pattern in LIBRARY_SYMBOLS.items():
            if pattern.match(sym) and lib not in links:
                violations.append({"rule": "forbidden_symbol", "where": "static",
                                   "detail": f"the library calls {sym!r} from {lib}, which this task does not allow"})
    return violations


def build(source_path: Path, *, card_arch: str, links: list[str], extra_flags: list[str], functions: list[str],
          cache_dir: Path, timeout_s: float = 120.0) -> BuildResult:
    """Compile `source_path` (a .cu file) into a shared library, or return the cached one."""
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
                           seconds=time.monotonic() - t0, violations=check_symbols(undefined_symbols(lib), links))
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
    violations = check_symbols(undefined_symbols(tmp / "candidate.so"), links)
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
