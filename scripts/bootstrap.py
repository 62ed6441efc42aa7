"""Make `.venv` beside this checkout and install CommBench-Env into it, with nothing but a stock `python3`.

Debian 12 and Ubuntu 24.04 refuse `pip install` into the system Python (PEP 668), and their `python3` may lack
`ensurepip` (it comes with the python3-venv package). So: a venv is made (without pip where ensurepip is
missing), pip is put into it from its wheel on PyPI if needed, then torch's CPU build and the package with its
test extras are installed. Standard library only; run it again to repair or update.

    python3 scripts/bootstrap.py [--venv .venv] [--torch torch==2.13.0] [--torch-index URL] [--extras test]
                                 [--system-site-packages]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYPI_JSON = "https://pypi.org/pypi/pip/json"


def say(text: str) -> None:
    print(f"[bootstrap] {text}", flush=True)


def has_ensurepip() -> bool:
    try:
        import ensurepip  # noqa: F401
    except ImportError:
        return False
    return True


def venv_python(path: Path) -> Path:
    return path / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")


def pip_from_pypi(python: Path) -> None:
    """Install pip into the venv from its newest wheel on PyPI (a wheel is importable, so it installs itself)."""
    with urllib.request.urlopen(PYPI_JSON, timeout=60) as resp:
        files = json.load(resp)["urls"]
    wheel = next(f for f in files if f["filename"].endswith(".whl"))
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / wheel["filename"]
        say(f"downloading {wheel['filename']} from PyPI (this python3 has no ensurepip)")
        urllib.request.urlretrieve(urllib.parse.urljoin(PYPI_JSON, wheel["url"]), target)  # mirrors answer relative URLs
        run([str(python), f"{target}/pip", "install", "--quiet", str(target)])


def run(cmd: list[str]) -> None:
    say(" ".join(cmd))
    subprocess.run(cmd, check=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--venv", type=Path, default=ROOT / ".venv")
    ap.add_argument("--torch", default="torch==2.13.0", help="torch requirement, installed first (CPU build on our "
                    "machines; elsewhere add --torch-index https://download.pytorch.org/whl/cpu)")
    ap.add_argument("--torch-index", default=None, help="an index URL for torch (e.g. PyTorch's CPU wheels)")
    ap.add_argument("--extras", default="test", help="the package's extras ('' for none)")
    ap.add_argument("--no-ensurepip", action="store_true", help="get pip from PyPI even if ensurepip exists")
    ap.add_argument("--system-site-packages", action="store_true", help="let the venv see this Python's packages "
                    "(with --torch torch, a CUDA torch already installed there is kept)")
    a = ap.parse_args()
    if sys.version_info < (3, 10):
        say(f"Python >= 3.10 is needed; this is {sys.version.split()[0]}")
        return 1
    python = venv_python(a.venv)
    if not python.exists():
        with_pip = has_ensurepip() and not a.no_ensurepip
        say(f"making {a.venv} ({'with' if with_pip else 'without'} ensurepip)")
        venv.create(a.venv, with_pip=with_pip, clear=a.venv.exists(), system_site_packages=a.system_site_packages)
    if subprocess.run([str(python), "-m", "pip", "--version"], capture_output=True).returncode != 0:
        pip_from_pypi(python)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    run(pip + [a.torch] + (["--index-url", a.torch_index] if a.torch_index else []))
    run(pip + ["-e", f"{ROOT}[{a.extras}]" if a.extras else str(ROOT)])
    say(f"done: {a.venv}/bin/commbench and {a.venv}/bin/python are ready")
    return 0


if __name__ == "__main__":
    sys.exit(main())
