"""The package's rooms follow the flow of an episode (card, episode, sandbox, judge, score, trace, run,
integrations): a room never imports one downstream of it, and no two modules import each other, counting late
imports inside functions (they are circles all the same, only deferred). Imports under TYPE_CHECKING are types,
not dependencies, and are left out."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import commbench_env

PACKAGE = Path(commbench_env.__file__).parent

# room -> rooms it must never import (at any depth of a function)
DOWNSTREAM = {
    "cards": {"episode", "sandbox", "score", "trace", "run", "integrations", "agents", "cli"},
    "golden": {"episode", "sandbox", "score", "trace", "run", "integrations", "agents", "cli"},
    "judge": {"episode", "sandbox", "score", "trace", "run", "integrations", "agents", "cli"},
    "sandbox": {"episode", "score", "trace", "run", "integrations", "agents", "cli"},
    "score": {"episode", "trace", "run", "integrations", "agents", "cli"},
    "episode": {"run", "integrations", "agents", "cli"},
    "trace": {"run", "integrations", "cli"},
    "agents": {"run", "integrations", "cli"},
    "run": {"integrations", "cli"},
    "integrations": {"cli"},
}
# The one circle left, and why: loading a card checks its `semantics.op` against golden's registry (golden imports
# torch, so late), and golden's ops build the cards' CaseSpec for benchmark sizes.
KNOWN_CIRCLES = [{"commbench_env.cards", "commbench_env.golden", "commbench_env.golden.base"}]


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        if "_cards" in path.parts:
            continue
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _imports(mod: str, path: Path, known: dict[str, Path]) -> set[str]:
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in
                   ast.unparse(node.test) for stmt in node.body for n in ast.walk(stmt)}
    package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("commbench_env"):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in known else target)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("commbench_env"))
    return {m for m in found if m in known and m != mod}


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(m, p, mods) for m, p in mods.items()}


def _room(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else ""


def _circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_one_that_imports_it_back():
    circles = [c for c in _circles(_graph()) if c not in KNOWN_CIRCLES]
    assert not circles, f"import circles: {[sorted(c) for c in circles]}"


@pytest.mark.parametrize("room", sorted(DOWNSTREAM))
def test_a_room_never_imports_a_room_downstream_of_it(room):
    wrong = sorted((m, d) for m, deps in _graph().items() if _room(m) == room
                   for d in deps if _room(d) in DOWNSTREAM[room])
    assert not wrong, f"{room}/ imports downstream rooms: {wrong}"


def test_the_checks_see_a_circle_and_a_downstream_import(tmp_path):
    """The graph really is built from the sources: a planted late import shows as a circle and a wrong edge."""
    graph = _graph()
    graph["commbench_env.sandbox.local"] = graph["commbench_env.sandbox.local"] | {"commbench_env.episode.core"}
    assert any("commbench_env.sandbox.local" in c for c in _circles(graph))
    src = PACKAGE / "sandbox" / "local.py"
    planted = src.read_text() + "\n\ndef _late():\n    from ..run import runner  # noqa: F401\n"
    fake = tmp_path / "local.py"
    fake.write_text(planted)
    assert "commbench_env.run.runner" in _imports("commbench_env.sandbox.local", fake, _modules())


def test_every_stage_room_is_a_package_with_its_modules():
    for room, modules in {"episode": ["core", "gym_env", "actions"], "sandbox": ["factory", "pool", "local"],
                          "judge": ["host", "coordinator", "candidate"], "score": ["reward", "reference"],
                          "trace": ["records", "replay", "viewer"], "run": ["runner", "evaluation", "rollouts"],
                          "integrations": ["trl_adapter", "verl_adapter"]}.items():
        for m in modules:
            assert (PACKAGE / room / f"{m}.py").is_file() or (PACKAGE / room / m / "__init__.py").is_file(), (room, m)
