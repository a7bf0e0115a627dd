"""Deterministic fingerprints of Python callables and values, for custom_partitioning callbacks.

A fingerprint must change whenever what a callback does can change, and must be the same in every
process running the same code: no ``id()``, no addresses, no reprs that may contain them, nothing
that depends on ``PYTHONHASHSEED``. Whatever cannot be fingerprinted soundly raises
:class:`Unfingerprintable`; the caller then keeps JAX's raw pointer (a cache miss, never a wrong
hit).

Code from trusted libraries (the standard library, jax, jaxlib, numpy, ml_dtypes) is identified by
its qualified name and the library's version instead of being followed; everything else is followed
through code objects, constants, defaults, closure cells and the module globals the code reads.
"""

from __future__ import annotations

import dis
import enum
import functools
import hashlib
import struct
import sys
import types
from collections.abc import Iterator
from typing import Any

# Packages whose code we identify by name + version instead of following it.
_TRUSTED_PACKAGES = frozenset({"jax", "jaxlib", "numpy", "ml_dtypes", "opt_einsum"}) | frozenset(
    sys.stdlib_module_names
)
# Class attributes that say nothing about behaviour (or are volatile).
_SKIP_CLASS_ATTRS = frozenset(
    {
        "__dict__",
        "__weakref__",
        "__doc__",
        "__module__",
        "__qualname__",
        "__firstlineno__",
        "__static_attributes__",
        "__annotations__",
        "__orig_bases__",
        "__parameters__",
    }
)
_MAX_NODES = 50_000
_LOAD_GLOBAL_OPS = frozenset({"LOAD_GLOBAL", "LOAD_NAME"})
_LOAD_ATTR_OPS = frozenset({"LOAD_ATTR", "LOAD_METHOD"})
# Builtins that read or run code by name at run time: what they reach cannot be followed.
_DYNAMIC_BUILTINS = frozenset(
    {"globals", "locals", "vars", "eval", "exec", "compile", "__import__"}
)
_BUILTIN_BASES = (bool, int, float, complex, str, bytes, tuple, list, dict, set, frozenset)
_C_CALLABLE_TYPES = frozenset({"method_descriptor", "wrapper_descriptor", "ufunc"})


class Unfingerprintable(Exception):
    """The value's behaviour cannot be captured deterministically; the message says why."""


def _top_package(module_name: str | None) -> str:
    return (module_name or "").partition(".")[0]


def is_trusted_module(module_name: str | None) -> bool:
    """Whether code in this module is identified by library name + version, not followed."""
    return _top_package(module_name) in _TRUSTED_PACKAGES or module_name == "builtins"


def _package_version(module_name: str | None) -> str:
    top = _top_package(module_name)
    if top in sys.stdlib_module_names or top in ("builtins", ""):
        return "python-" + ".".join(map(str, sys.version_info[:3]))
    mod = sys.modules.get(top)
    return str(getattr(mod, "__version__", "unknown"))


def global_refs(code: types.CodeType) -> Iterator[tuple[str, tuple[str, ...]]]:
    """Global names a code object (and nested ones) reads, each with the attribute chain after it.

    ``jnp.sin`` gives ``("jnp", ("sin",))``; a bare ``ADD`` gives ``("ADD", ())``.
    """
    chain: list[str] | None = None
    head = ""
    for ins in dis.get_instructions(code):
        if ins.opname in _LOAD_ATTR_OPS and chain is not None:
            chain.append(str(ins.argval))
            continue
        if chain is not None:
            yield head, tuple(chain)
            chain = None
        if ins.opname in _LOAD_GLOBAL_OPS:
            head, chain = str(ins.argval), []
        elif ins.opname == "IMPORT_NAME":
            yield "import:" + str(ins.argval), ()
    if chain is not None:
        yield head, tuple(chain)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from global_refs(const)


class Fingerprinter:
    """Feeds a canonical byte stream of values into SHA-256; one instance per fingerprint."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()
        self._memo: dict[int, int] = {}
        self._keep: list[Any] = []  # keeps memoised objects alive so ids are not reused
        self._nodes = 0

    def hexdigest(self) -> str:
        return self._h.hexdigest()

    # -- primitives ---------------------------------------------------------------------------
    def _tag(self, tag: str) -> None:
        self._h.update(tag.encode() + b"\x00")

    def _bytes(self, data: bytes) -> None:
        self._h.update(struct.pack("<Q", len(data)) + data)

    def _str(self, s: str) -> None:
        self._bytes(s.encode("utf-8", "surrogatepass"))

    # -- dispatch ---------------------------------------------------------------------------
    def add(self, obj: Any) -> None:
        """Add one value (recursively)."""
        self._nodes += 1
        if self._nodes > _MAX_NODES:
            raise Unfingerprintable(f"more than {_MAX_NODES} objects reachable")
        if obj is None or obj is Ellipsis or obj is NotImplemented:
            self._tag(repr(obj))
            return
        t = type(obj)
        if t is bool:
            self._tag("T" if obj else "F")
            return
        if t is int:
            self._tag("int")
            self._str(str(obj))
            return
        if t is float:
            self._tag("float")
            self._str(obj.hex())
            return
        if t is complex:
            self._tag("complex")
            self._str(obj.real.hex() + "," + obj.imag.hex())
            return
        if t is str:
            self._tag("str")
            self._str(obj)
            return
        if t is bytes:
            self._tag("bytes")
            self._bytes(obj)
            return
        # containers and objects: memoise by identity so cycles and sharing are expressed
        oid = id(obj)
        if oid in self._memo:
            self._tag("ref")
            self._str(str(self._memo[oid]))
            return
        self._memo[oid] = len(self._memo)
        self._keep.append(obj)
        self._add_object(obj, t)

    def _add_object(self, obj: Any, t: type) -> None:
        if t in (tuple, list):
            self._tag(t.__name__)
            self._str(str(len(obj)))
            for item in obj:
                self.add(item)
            return
        if t is dict:
            self._tag("dict")
            self._str(str(len(obj)))
            for k, v in obj.items():
                self.add(k)
                self.add(v)
            return
        if t in (set, frozenset):
            self._tag(t.__name__)
            digests = sorted(_digest_of(item) for item in obj)
            for d in digests:
                self._str(d)
            return
        if isinstance(obj, types.CodeType):
            self._add_code(obj)
            return
        if isinstance(obj, types.FunctionType):
            self._add_function(obj)
            return
        if isinstance(obj, types.ModuleType):
            self._add_module(obj)
            return
        if isinstance(obj, type):
            self._add_class(obj)
            return
        if isinstance(obj, types.MethodType):
            self._tag("method")
            self.add(obj.__func__)
            self.add(obj.__self__)
            return
        if isinstance(obj, functools.partial):
            self._tag("partial")
            self.add(obj.func)
            self.add(obj.args)
            self.add(obj.keywords)
            return
        if isinstance(obj, (staticmethod, classmethod)):
            self._tag(type(obj).__name__)
            self.add(obj.__func__)
            return
        if isinstance(obj, property):
            self._tag("property")
            self.add((obj.fget, obj.fset, obj.fdel))
            return
        if isinstance(obj, enum.Enum):
            self._tag("enum")
            self.add(type(obj))
            self._str(obj.name)
            return
        if self._add_known_library_value(obj, t):
            return
        if isinstance(obj, (types.BuiltinFunctionType, types.BuiltinMethodType)) or (
            callable(obj) and type(obj).__name__ in _C_CALLABLE_TYPES
        ):
            self._add_builtin(obj)
            return
        base = next((b for b in _BUILTIN_BASES if isinstance(obj, b)), None)
        if base is not None:
            # a subclass of a builtin (NamedTuple, str enum-like, OrderedDict, ...): its value
            # lives in the builtin part, which vars() does not show
            self._tag("builtin-subclass")
            self.add(t)
            self.add(base(obj))
            if hasattr(obj, "__dict__"):
                self.add(dict(vars(obj)))
            return
        if is_trusted_module(t.__module__):
            if t.__name__ == "_tuplegetter":  # NamedTuple field: (index, doc)
                self._tag("tuplegetter")
                self.add(obj.__reduce__()[1])
                return
            if t is types.SimpleNamespace:
                self._tag("namespace")
                self.add(dict(vars(obj)))
                return
            raise Unfingerprintable(f"unsupported {t.__module__}.{t.__qualname__} value")
        self._add_instance(obj, t)

    # -- code ---------------------------------------------------------------------------
    def _add_code(self, code: types.CodeType) -> None:
        self._tag("code")
        self._str(code.co_name)
        self._bytes(code.co_code)
        for attr in ("co_argcount", "co_posonlyargcount", "co_kwonlyargcount", "co_flags"):
            self._str(str(getattr(code, attr)))
        for attr in ("co_names", "co_varnames", "co_freevars", "co_cellvars"):
            self._str("\x1f".join(getattr(code, attr)))
        self._bytes(getattr(code, "co_exceptiontable", b""))
        self._tag("consts")
        self._str(str(len(code.co_consts)))
        for const in code.co_consts:
            self.add(const)

    def _add_function(self, fn: types.FunctionType) -> None:
        module = getattr(fn, "__module__", None)
        if is_trusted_module(module):
            self._tag("libfunc")
            self._str(f"{module}:{fn.__qualname__}:{_package_version(module)}")
        else:
            self._tag("func")
            self.add(fn.__code__)
            self._add_globals(fn)
        self.add(fn.__defaults__)
        self.add(fn.__kwdefaults__)
        self._tag("closure")
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=False):
            self._str(name)
            try:
                value = cell.cell_contents
            except ValueError:
                self._tag("empty-cell")
                continue
            self.add(value)

    def _add_globals(self, fn: types.FunctionType) -> None:
        g = fn.__globals__
        builtins = g.get("__builtins__", {})
        if isinstance(builtins, types.ModuleType):
            builtins = vars(builtins)
        seen: set[tuple[str, tuple[str, ...]]] = set()
        refs = sorted(set(global_refs(fn.__code__)))
        self._tag("globals")
        for name, chain in refs:
            if (name, chain) in seen:
                continue
            seen.add((name, chain))
            self._str(name + "." + ".".join(chain))
            if name.startswith("import:"):
                modname = name[len("import:") :]
                if not is_trusted_module(modname):
                    raise Unfingerprintable(
                        f"{fn.__qualname__} imports non-library module {modname}"
                    )
                self._str(_package_version(modname))
                continue
            if name in g:
                value = g[name]
            elif name in builtins:
                if name in _DYNAMIC_BUILTINS:
                    raise Unfingerprintable(f"{fn.__qualname__} calls {name}()")
                value = builtins[name]
            else:
                self._tag("missing")
                continue
            self._add_chain(value, chain)

    def _add_chain(self, value: Any, chain: tuple[str, ...]) -> None:
        """Follow ``mod.sub.attr`` through user modules; stop at the first non-module value."""
        for attr in chain:
            if not isinstance(value, types.ModuleType) or is_trusted_module(value.__name__):
                break
            self._tag("attr")
            self._str(attr)
            if not hasattr(value, attr):
                self._tag("missing")
                return
            value = getattr(value, attr)
        if isinstance(value, types.ModuleType) and not is_trusted_module(value.__name__):
            raise Unfingerprintable(f"module {value.__name__} used as a value")
        self.add(value)

    def _add_module(self, mod: types.ModuleType) -> None:
        if not is_trusted_module(mod.__name__):
            raise Unfingerprintable(f"module {mod.__name__} used as a value")
        self._tag("module")
        self._str(f"{mod.__name__}:{_package_version(mod.__name__)}")

    def _add_class(self, cls: type) -> None:
        module = cls.__module__
        if is_trusted_module(module):
            self._tag("libclass")
            self._str(f"{module}:{cls.__qualname__}:{_package_version(module)}")
            return
        self._tag("class")
        self._str(cls.__qualname__)
        self.add(cls.__bases__)
        if issubclass(cls, enum.Enum):
            self.add([(m.name, m.value) for m in cls])
        items = [(k, v) for k, v in vars(cls).items() if k not in _SKIP_CLASS_ATTRS]
        if issubclass(cls, enum.Enum):
            items = [(k, v) for k, v in items if not k.startswith("_") and not isinstance(v, cls)]
        for k, v in sorted(items, key=lambda kv: kv[0]):
            self._str(k)
            self.add(v)

    def _add_builtin(self, obj: Any) -> None:
        module = getattr(obj, "__module__", None)
        owner = getattr(obj, "__objclass__", None)
        if module is None and owner is not None:
            module = owner.__module__
        bound_to = getattr(obj, "__self__", None)
        if module is None and isinstance(bound_to, types.ModuleType):
            module = bound_to.__name__
        elif module is None and isinstance(bound_to, type):  # e.g. tuple.__new__
            module = bound_to.__module__
        if type(obj).__name__ == "ufunc" and module is None:
            module = "numpy"
        if not is_trusted_module(module):
            raise Unfingerprintable(f"C function {getattr(obj, '__qualname__', obj)!s} of {module}")
        self._tag("builtin")
        self._str(f"{module}:{getattr(obj, '__qualname__', getattr(obj, '__name__', ''))}")
        self._str(_package_version(module))
        bound = getattr(obj, "__self__", None)
        if bound is not None and not isinstance(bound, types.ModuleType):
            self.add(bound)

    def _add_instance(self, obj: Any, t: type) -> None:
        self._tag("instance")
        self.add(t)
        slots: list[str] = []
        for klass in t.__mro__:
            s = vars(klass).get("__slots__", ())
            slots.extend([s] if isinstance(s, str) else s)
        if not hasattr(obj, "__dict__") and not slots:
            raise Unfingerprintable(f"{t.__qualname__} instance has no inspectable state")
        if hasattr(obj, "__dict__"):
            self.add(dict(vars(obj)))
        for name in slots:
            if name in ("__dict__", "__weakref__"):
                continue
            self._str(name)
            self.add(getattr(obj, name, None))

    def _add_known_library_value(self, obj: Any, t: type) -> bool:
        """Values of trusted libraries that callbacks commonly hold: arrays, meshes, shardings."""
        module = t.__module__ or ""
        top = _top_package(module)
        if top == "numpy" or (t.__name__ in ("dtype",) and module.startswith("numpy")):
            import numpy as np

            if isinstance(obj, np.ndarray):
                if obj.dtype.hasobject:
                    raise Unfingerprintable("numpy array of Python objects")
                self._tag("ndarray")
                self._str(obj.dtype.str + repr(obj.shape))
                self._bytes(np.ascontiguousarray(obj).tobytes())
                return True
            if isinstance(obj, np.generic):
                self._tag("npscalar")
                self._str(obj.dtype.str)
                self._bytes(obj.tobytes())
                return True
            if isinstance(obj, np.dtype):
                self._tag("dtype")
                self._str(obj.str + ":" + obj.name)
                return True
            return False
        if top not in ("jax", "jaxlib"):
            return False
        name = t.__name__
        if name == "Mesh" and hasattr(obj, "axis_names") and hasattr(obj, "devices"):
            self._tag("mesh")
            self.add(tuple(obj.axis_names))
            self._str(repr(tuple(obj.devices.shape)))
            self.add([_device_id(d) for d in obj.devices.flat])
            axis_types = getattr(obj, "axis_types", None)
            self._str(str(axis_types) if axis_types is not None else "")
            return True
        if name == "NamedSharding":
            self._tag("named-sharding")
            self.add(obj.mesh)
            self._str(repr(obj.spec))
            self._str(str(obj.memory_kind))
            return True
        if name == "PartitionSpec":
            self._tag("pspec")
            self._str(repr(obj))
            return True
        is_device = hasattr(obj, "platform") and hasattr(obj, "id") and name.endswith("Device")
        if name == "Device" or is_device:
            self._tag("device")
            self._str(_device_id(obj))
            return True
        if name == "PyTreeDef":
            # str(treedef) lists node kinds and arity only: stable across processes
            text = str(obj)
            if " at 0x" in text:
                raise Unfingerprintable("pytree node data whose repr holds an address")
            self._tag("treedef")
            self._str(text)
            return True
        if hasattr(obj, "__array__") and hasattr(obj, "dtype") and hasattr(obj, "shape"):
            import numpy as np

            self._tag("jax-array")
            self.add(np.asarray(obj))
            return True
        return False


def _device_id(d: Any) -> str:
    return f"{getattr(d, 'platform', '?')}:{getattr(d, 'id', '?')}"


def _digest_of(obj: Any) -> str:
    fp = Fingerprinter()
    fp.add(obj)
    return fp.hexdigest()


def fingerprint(obj: Any) -> str:
    """Hex SHA-256 of ``obj``'s behaviour-relevant content; raises :class:`Unfingerprintable`."""
    return _digest_of(obj)
