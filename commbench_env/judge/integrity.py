"""Put back what candidate code changed in the namespaces the harness runs on, and say what it was.

Why: Python lets any code reassign a module's function or a class's method, and no audit event reports it. The
harness keeps running Python in the rank after every call (making inputs, sampling outputs, sending results), so a
function it looks up there that the candidate replaced would run candidate code on the harness's thread, outside
the sandbox. A snapshot is taken before the candidate loads; after each call (candidate_thread.start's `settle`)
every changed or removed entry is put back, every added class attribute removed, and each one reported as a
violation; so are the interpreter's hook lists (import finders, gc callbacks), which run on any thread. Covered: builtins, the harness's own modules and classes, and the modules and classes of torch, numpy,
pydantic and the standard library that the harness calls after the candidate has run. In those foreign modules only
functions, classes and modules are protected: their plain values (flags, counters) are library state that changes.

The checker is a closure over locals: it must not itself look up anything the candidate could have replaced.
"""

from __future__ import annotations

import sys
import types
from typing import Any, Callable

OWN_PREFIXES = ("commbench_env",)
FOREIGN_PREFIXES = ("pydantic", "pydantic_core")
FOREIGN_MODULES = ("builtins", "sys", "os", "time", "socket", "struct", "json", "pickle", "threading", "_thread",
                   "functools", "linecache", "traceback", "math", "io", "hashlib", "numpy", "torch", "torch._tensor",
                   "torch.overrides", "torch.functional", "torch.random", "torch.cuda", "torch.cuda.streams",
                   "torch.distributed", "torch.distributed.distributed_c10d", "torch.profiler",
                   "torch.profiler.profiler", "torch.autograd.profiler", "torch.autograd.profiler_util", "torch._C",
                   "gc")
# values that are not functions but that the interpreter calls or consults on whatever thread is running
HOOKS = {"sys": ("stdout", "stderr", "stdin", "__stdout__", "__stderr__", "meta_path", "path_hooks",
                 "path_importer_cache"), "gc": ("callbacks",)}
HOOK_LISTS = (("sys.meta_path", lambda: sys.meta_path), ("sys.path_hooks", lambda: sys.path_hooks),
              ("gc.callbacks", lambda: __import__("gc").callbacks))
MAX_REPORTED = 10


def _protected_modules() -> list[tuple[str, types.ModuleType, bool]]:
    """(name, module, own) for every loaded module the harness relies on."""
    out = []
    for name, mod in list(sys.modules.items()):
        if not isinstance(mod, types.ModuleType):
            continue
        own = name.startswith(OWN_PREFIXES)
        if own or name in FOREIGN_MODULES or name.split(".")[0] in FOREIGN_PREFIXES:
            out.append((name, mod, own))
    return out


def _guarded(value: Any) -> bool:
    return callable(value) or issubclass(type(value), types.ModuleType)


def snapshot(extra_classes: tuple[type, ...] = ()) -> Callable[[], list[str]]:
    """Take the snapshot now; return `settle()`, which restores it and returns what had been changed."""
    modules = _protected_modules()
    module_names = {name for name, _, _ in modules}
    entries: list[tuple[str, dict, str, Any]] = []  # (where, namespace, name, value)
    classes: dict[int, tuple[str, type, dict]] = {}
    for name, mod, own in modules:
        ns = vars(mod)
        for key, value in list(ns.items()):
            if type(key) is not str or not (own or _guarded(value) or key in HOOKS.get(name, ())):
                continue
            entries.append((name, ns, key, value))
            if issubclass(type(value), type) and (getattr(value, "__module__", None) in module_names or value in extra_classes):
                classes.setdefault(id(value), (f"{value.__module__}.{value.__qualname__}", value, dict(vars(value))))
    for cls in extra_classes:
        classes.setdefault(id(cls), (f"{cls.__module__}.{cls.__qualname__}", cls, dict(vars(cls))))
    class_list = [(label, cls, vars(cls), saved, len(saved)) for label, cls, saved in classes.values()]
    lists = [(label, get(), list(get())) for label, get in HOOK_LISTS]  # finders and gc callbacks run anywhere
    module_table = sys.modules
    module_entries = [(name, mod) for name, mod, _ in modules]
    missing = object()
    set_class_attr, del_class_attr, str_type, type_of, length, limit = (
        type.__setattr__, type.__delattr__, str, type, len, MAX_REPORTED)
    zip_ = zip

    def settle() -> list[str]:
        changed: list[str] = []
        for name, mod in module_entries:
            if module_table.get(name, missing) is not mod:
                module_table[name] = mod
                changed.append(f"sys.modules[{name!r}]")
        for where, ns, key, value in entries:
            if ns.get(key, missing) is not value:
                ns[key] = value
                changed.append(f"{where}.{key}")
        for label, live, saved in lists:
            if length(live) != length(saved) or not all_same_items(live, saved):
                live[:] = saved
                changed.append(label)
        for label, cls, live, saved, count in class_list:
            if length(live) == count and all_same(live, saved):
                continue
            for key in [k for k in live if type_of(k) is not str_type or saved.get(k, missing) is missing]:
                del_class_attr(cls, key) if type_of(key) is str_type else None
                changed.append(f"{label}.{key if type_of(key) is str_type else '?'} (added)")
            for key, value in saved.items():
                if live.get(key, missing) is not value:
                    set_class_attr(cls, key, value)
                    changed.append(f"{label}.{key}")
        return changed[:limit]

    def all_same_items(live: list, saved: list) -> bool:
        for a, b in zip_(live, saved):
            if a is not b:
                return False
        return True

    def all_same(live: Any, saved: dict) -> bool:
        for key, value in saved.items():
            if live.get(key, missing) is not value:
                return False
        return True

    return settle
