"""Put back what candidate code changed in the namespaces the harness runs on, and say what it was.

Why: Python lets any code reassign a module's function or a class's method, and no audit event reports it. The
harness keeps running Python in the rank after every call (making inputs, sampling outputs, sending results), so a
function it looks up there that the candidate replaced would run candidate code on the harness's thread, outside
the sandbox. A snapshot is taken before the candidate loads; after each call (the `settle` given to
candidate_thread.start) every changed or removed entry is put back, every added class attribute removed, and each
one reported as a violation; so are the interpreter's hook lists (import finders, gc callbacks), which run on any
thread. Covered: builtins, the harness's own modules and classes, and the modules and classes of torch, numpy,
pydantic and the standard library that the harness calls after the candidate has run. In those foreign modules only
functions, classes and modules are protected: their plain values (flags, counters) are library state that changes.

The checker is a closure over locals: it must not itself look up anything the candidate could have replaced.
"""

from __future__ import annotations

import builtins
import gc
import itertools
import operator
import sys
import types
from typing import Any, Callable

OWN_PREFIXES = ("commbench_env",)
FOREIGN_MODULES = ("builtins", "sys", "os", "time", "socket", "struct", "json", "pickle", "threading", "_thread",
                   "functools", "linecache", "traceback", "math", "io", "hashlib", "numpy", "torch", "torch._tensor",
                   "torch.overrides", "torch.functional", "torch.random", "torch.cuda", "torch.cuda.streams",
                   "torch.distributed", "torch.distributed.distributed_c10d", "torch.profiler",
                   "torch.profiler.profiler", "torch.autograd.profiler", "torch.autograd.profiler_util", "torch._C",
                   "torch.cuda.memory", "torch.cuda._utils", "torch._utils", "gc",
                   "pydantic.main", "pydantic._internal._model_construction")  # CaseSpec.model_validate
# values that are not functions but that the interpreter calls or consults on whatever thread is running
HOOKS = {"sys": ("stdout", "stderr", "stdin", "__stdout__", "__stderr__", "meta_path", "path_hooks",
                 "path_importer_cache"), "gc": ("callbacks",)}
HOOK_LISTS = (("sys.meta_path", lambda: sys.meta_path), ("sys.path_hooks", lambda: sys.path_hooks),
              ("gc.callbacks", lambda: gc.callbacks))
MAX_REPORTED = 10


def _protected_modules() -> list[tuple[str, types.ModuleType, bool]]:
    """(name, module, own) for every loaded module the harness relies on."""
    out = []
    for name, mod in list(sys.modules.items()):
        if not isinstance(mod, types.ModuleType):
            continue
        own = name.startswith(OWN_PREFIXES)
        if own or name in FOREIGN_MODULES:
            out.append((name, mod, own))
    return out


def _mutable(cls: type) -> bool:
    """Static and immutable types refuse attribute writes anyway (Py_TPFLAGS_HEAPTYPE, Py_TPFLAGS_IMMUTABLETYPE)."""
    return bool(cls.__flags__ & (1 << 9)) and not cls.__flags__ & (1 << 8)


def _guarded(value: Any) -> bool:
    return callable(value) or issubclass(type(value), types.ModuleType)


def snapshot(extra_classes: tuple[type, ...] = ()) -> Callable[[], list[str]]:
    """Take the snapshot now; return `settle()`, which restores it and returns what had been changed.

    All namespaces are first compared at once, by identity of their keys and values in order (C loops: a settle
    costs well under a millisecond when nothing changed); only when that differs is each namespace examined, name
    by name, and then the picture is retaken, so library state that legitimately changes is examined once."""
    modules = _protected_modules()
    module_names = {name for name, _, _ in modules}
    shadowable = frozenset(dir(builtins))  # an added global of these names would shadow a builtin
    groups: list[tuple[str, dict, bool, list, list, list]] = []  # (where, ns, own, keys, values, guarded entries)
    classes: dict[int, type] = {}
    for name, mod, own in modules:
        ns = vars(mod)
        guarded = []  # (name, value) put back when changed: in foreign modules only functions, classes, modules
        for key, value in list(ns.items()):
            if type(key) is not str or not (own or _guarded(value) or key in HOOKS.get(name, ())):
                continue
            guarded.append((key, value))
            if not issubclass(type(value), type):
                continue
            if getattr(value, "__module__", None) in module_names or value in extra_classes:
                classes.setdefault(id(value), value)
        groups.append((name, ns, own, list(ns.keys()), list(ns.values()), guarded))
    for cls in extra_classes:
        classes.setdefault(id(cls), cls)
    class_list = [(f"{c.__module__}.{c.__qualname__}", c, vars(c), dict(vars(c)), list(vars(c).keys()),
                   list(vars(c).values())) for c in classes.values() if _mutable(c)]
    lists = [(label, get(), list(get())) for label, get in HOOK_LISTS]  # finders and gc callbacks run anywhere
    module_table = sys.modules
    module_entries = [(name, mod) for name, mod, _ in modules]
    missing = object()
    set_class_attr, del_class_attr, str_type, type_of, length, limit = (
        type.__setattr__, type.__delattr__, str, type, len, MAX_REPORTED)
    all_, map_, is_, list_, sum_, chain_ = all, map, operator.is_, list, sum, itertools.chain.from_iterable
    values_of, keys_of = operator.methodcaller("values"), operator.methodcaller("keys")
    spaces = [g[1] for g in groups] + [c[2] for c in class_list]
    kept: list = []
    whole: list = []

    def picture() -> None:
        whole[:] = [sum_(map_(length, spaces)), list_(chain_(map_(keys_of, spaces))),
                    list_(chain_(map_(values_of, spaces)))]

    def unchanged() -> bool:
        """Every namespace at once, in C loops: the common case, where the candidate changed nothing."""
        return (sum_(map_(length, spaces)) == whole[0] and all_(map_(is_, chain_(map_(values_of, spaces)), whole[2]))
                and all_(map_(is_, chain_(map_(keys_of, spaces)), whole[1])))

    def same(live: Any, keys: list, values: list) -> bool:
        return (length(live) == length(keys) and all_(map_(is_, live.values(), values))
                and all_(map_(is_, live.keys(), keys)))

    def settle() -> list[str]:
        changed: list[str] = []
        if not unchanged():
            examine(changed)
            picture()
        for name, mod in module_entries:
            if module_table.get(name, missing) is not mod:
                module_table[name] = mod
                changed.append(f"sys.modules[{name!r}]")
        for label, live, saved_list in lists:
            if length(live) != length(saved_list) or not all_(map_(is_, live, saved_list)):
                live[:] = saved_list
                changed.append(label)
        return changed[:limit]

    def examine(changed: list[str]) -> None:
        for where, ns, own, keys, values, guarded in groups:
            if same(ns, keys, values):
                continue
            odd = [k for k in ns if type_of(k) is not str_type]
            if odd:  # a key that is not a str runs its own code when compared: rebuild without it, never hashing it
                kept.extend(odd)  # and never free it here
                plain = [(k, v) for k, v in ns.items() if type_of(k) is str_type]
                ns.clear()
                ns.update(plain)
                changed.append(f"{where}: a global whose name is not a string (removed)")
            for key, value in guarded:
                if ns.get(key, missing) is not value:
                    ns[key] = value
                    changed.append(f"{where}.{key}")
            saved = {k for k, _ in guarded}
            for key in [k for k in ns if type_of(k) is str_type and k not in saved and (own or k in shadowable)
                        and (own or not keys.count(k))]:
                del ns[key]
                changed.append(f"{where}.{key} (added)")
            keys[:] = list_(ns.keys())
            values[:] = list_(ns.values())
        for label, cls, live, saved, keys, values in class_list:
            if same(live, keys, values):
                continue
            for key in [k for k in live if type_of(k) is not str_type or saved.get(k, missing) is missing]:
                del_class_attr(cls, key) if type_of(key) is str_type else None
                changed.append(f"{label}.{key if type_of(key) is str_type else '?'} (added)")
            for key, value in saved.items():
                if live.get(key, missing) is not value:
                    set_class_attr(cls, key, value)
                    changed.append(f"{label}.{key}")

    picture()
    return settle
