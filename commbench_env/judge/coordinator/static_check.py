"""Static checks of a torch candidate: syntax, imports, forbidden APIs (through aliases and getattr), introspection.

Runs in the coordinator on the source text; the candidate is never imported here.
"""

from __future__ import annotations

import ast
import re
import importlib.util
from dataclasses import dataclass, field

from ..rules import ALLOWED_IMPORTS, AMBIGUOUS_METHODS, FORBIDDEN_BUILTINS, STREAM_APIS, STREAM_RULE, is_forbidden


@dataclass
class StaticReport:
    ok: bool
    log: str = ""
    violations: list[dict] = field(default_factory=list)
    syntax_error: bool = False


class _Checker(ast.NodeVisitor):
    def __init__(self, forbidden: set[str], forbidden_attrs: set[str], allowed_imports: set[str],
                 docstrings: set[int] = frozenset()):
        self.docstrings = docstrings  # ids of the docstring constants (free text, not checked as names)
        self.forbidden = forbidden
        self.forbidden_attrs = forbidden_attrs - AMBIGUOUS_METHODS  # those are left to the run-time tripwire
        self.allowed = allowed_imports
        self.aliases: dict[str, str] = {}
        self.violations: list[dict] = []
        self.imports: list[tuple[str, int]] = []

    def flag(self, node: ast.AST, rule: str, detail: str) -> None:
        self.violations.append({"rule": rule, "detail": detail, "where": "static", "line": getattr(node, "lineno", None)})

    # -- names ---------------------------------------------------------------------------------------
    def resolve(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value)
            return f"{base}.{node.attr}" if base else None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
            base = self.resolve(node.args[0])
            return f"{base}.{node.args[1].value}" if base else None
        return None

    def check_dotted(self, node: ast.AST, dotted: str | None) -> None:
        if dotted:
            hit = is_forbidden(dotted, self.forbidden)
            if hit in STREAM_APIS:
                self.flag(node, "forbidden_api", f"{dotted} is not allowed: {STREAM_RULE}")
            elif hit:
                self.flag(node, "forbidden_api", f"{dotted} is not allowed in this task ({hit})")

    def check_import(self, node: ast.AST, module: str) -> None:
        parts = module.split(".")
        if parts[0] not in self.allowed:
            self.flag(node, "forbidden_import", f"import of {module!r} is not allowed; allowed: {', '.join(sorted(self.allowed))}")
        elif any(p.startswith("_") and p != "__future__" for p in parts):
            self.flag(node, "forbidden_import", f"import of private module {module!r} is not allowed")
        else:
            self.check_dotted(node, module)
            self.imports.append((module, getattr(node, "lineno", 0)))

    # -- visitors ------------------------------------------------------------------------------------
    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            self.check_import(node, a.name)
            if a.asname:
                self.aliases[a.asname] = a.name
            else:
                top = a.name.split(".")[0]
                self.aliases[top] = top

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            self.flag(node, "forbidden_import", "relative imports are not allowed")
            return
        mod = node.module or ""
        self.check_import(node, mod)
        for a in node.names:
            if a.name == "*":
                self.flag(node, "forbidden_import", "'from ... import *' is not allowed (name every import)")
                continue
            if a.name.startswith("_") and mod != "__future__":
                self.flag(node, "private_access", f"private name {a.name!r} is not allowed")
            full = f"{mod}.{a.name}"
            self.check_dotted(node, full)
            self.aliases[a.asname or a.name] = full

    def visit_Assign(self, node: ast.Assign) -> None:
        target = self.resolve(node.value)
        if target:
            for t in node.targets:
                if isinstance(t, ast.Name):
                    self.aliases[t.id] = target
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        attr = node.attr
        owner_is_self = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
        if attr.startswith("_") and not owner_is_self:
            self.flag(node, "private_access", f"access to private or dunder attribute {attr!r} is not allowed")
        elif attr in self.forbidden_attrs:
            self.flag(node, "forbidden_api", f"method {attr!r} is not allowed in this task")
        else:
            self.check_dotted(node, self.resolve(node))
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in FORBIDDEN_BUILTINS:
            self.flag(node, "forbidden_builtin", f"builtin {node.id!r} is not allowed")
        elif node.id.startswith("__") and node.id not in ("__name__",):
            self.flag(node, "private_access", f"name {node.id!r} is not allowed")
        else:
            self.check_dotted(node, self.aliases.get(node.id) if isinstance(node.ctx, ast.Load) else None)

    def visit_Call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
            if len(node.args) < 2 or not (isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
                self.flag(node, "dynamic_attribute", f"{node.func.id}() needs a literal attribute name")
            else:
                name = node.args[1].value
                if name.startswith("_"):
                    self.flag(node, "private_access", f"access to private or dunder attribute {name!r} is not allowed")
                elif name in self.forbidden_attrs:
                    self.flag(node, "forbidden_api", f"method {name!r} is not allowed in this task")
                else:
                    self.check_dotted(node, self.resolve(node))
        self.generic_visit(node)

    def visit_Global(self, node: ast.Global) -> None:
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        """A string that names a dunder or private attribute reaches it without an attribute node: through a
        format field ("{0.__globals__}"), or any API that looks attributes up by name."""
        if isinstance(node.value, str) and id(node) not in self.docstrings:
            m = _DUNDER.search(node.value) or _FORMAT_PRIVATE.search(node.value)
            if m:
                self.flag(node, "private_access", f"the string {m.group(0)!r} names a private or dunder attribute; "
                          "attributes are reached by name in code, not through strings")


_DUNDER = re.compile(r"__[A-Za-z][A-Za-z0-9_]*__")
_FORMAT_PRIVATE = re.compile(r"\{[^{}]*[.\[]\s*_[^{}]*\}")


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of docstring constants (free text, never evaluated as names)."""
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.body:
            first = n.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def check_source(source: str, filename: str, forbidden: set[str], forbidden_attrs: set[str],
                 extra_imports: list[str] | None = None, required: list[str] | None = None) -> StaticReport:
    """Parse and check a candidate. Never executes it."""
    try:
        tree = ast.parse(source, filename=filename)
        compile(tree, filename, "exec")
    except SyntaxError as exc:
        where = f'File "{filename}", line {exc.lineno}' + (f", column {exc.offset}" if exc.offset else "")
        text = (exc.text or "").rstrip("\n")
        caret = (" " * max(0, (exc.offset or 1) - 1) + "^") if text else ""
        log = f"{where}\n    {text}\n    {caret}\nSyntaxError: {exc.msg}" if text else f"{where}\nSyntaxError: {exc.msg}"
        return StaticReport(ok=False, log=log, syntax_error=True)
    allowed = set(ALLOWED_IMPORTS) | set(extra_imports or [])
    checker = _Checker(forbidden, forbidden_attrs, allowed, _docstrings(tree))
    checker.visit(tree)
    notes: list[str] = []
    for module, line in checker.imports:
        if module == "__future__":
            continue
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            checker.violations.append({"rule": "import_error", "detail": f"module {module!r} cannot be imported here",
                                       "where": "static", "line": line})
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    defined |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    missing = [f for f in (required or []) if f not in defined]
    if missing:
        notes.append(f"{filename}: missing required function(s): {', '.join(missing)}")
    for v in checker.violations:
        notes.append(f"{filename}:{v['line']}: {v['rule']}: {v['detail']}")
    ok = not checker.violations and not missing
    return StaticReport(ok=ok, log="\n".join(notes), violations=checker.violations)
