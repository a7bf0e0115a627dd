"""The stable hasher's building blocks: fingerprints, path canonicalisation, key combination."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest

from cachedoctor.stablekeys import keys
from cachedoctor.stablekeys.fingerprint import Unfingerprintable, fingerprint


def _module_with(source: str, name: str = "fpmod") -> types.ModuleType:
    """A fresh user module (not a trusted library) executing ``source``."""
    mod = types.ModuleType(name)
    exec(compile(textwrap.dedent(source), f"<{name}>", "exec"), mod.__dict__)
    return mod


BASE = """
import numpy as np
SCALE = 2.0
TABLE = (1, "a", np.arange(3))

def helper(x):
    return x * SCALE

def partition(mesh, arg_shapes, result_shape):
    def lower(x):
        return helper(x) + TABLE[0]
    return mesh, lower
"""


def test_same_code_same_fingerprint_across_modules() -> None:
    a = _module_with(BASE, "a")
    b = _module_with(BASE, "b")
    assert fingerprint(a.partition) == fingerprint(b.partition)


@pytest.mark.parametrize(
    "change",
    [
        ("SCALE = 2.0", "SCALE = 3.0"),  # a module-level number read by a helper
        ('TABLE = (1, "a"', 'TABLE = (2, "a"'),  # a tuple constant
        ("np.arange(3)", "np.arange(4)"),  # a numpy array global
        ("return x * SCALE", "return x / SCALE"),  # code of a function it calls
        ("+ TABLE[0]", "- TABLE[0]"),  # code of a nested function it returns
    ],
)
def test_any_behaviour_change_changes_fingerprint(change: tuple[str, str]) -> None:
    old, new = change
    assert old in BASE
    a = _module_with(BASE)
    b = _module_with(BASE.replace(old, new))
    assert fingerprint(a.partition) != fingerprint(b.partition)


def test_line_numbers_do_not_matter() -> None:
    a = _module_with(BASE)
    b = _module_with("\n\n\n# moved\n" + BASE)
    assert fingerprint(a.partition) == fingerprint(b.partition)


def test_closures_defaults_and_partials() -> None:
    import functools

    def make(k):
        def f(x, y=k):
            return x + k + y

        return f

    assert fingerprint(make(1)) == fingerprint(make(1))
    assert fingerprint(make(1)) != fingerprint(make(2))
    assert fingerprint(functools.partial(make(1), 3)) != fingerprint(functools.partial(make(1), 4))


def test_user_module_attribute_chain_is_followed() -> None:
    lib1 = _module_with("def op(x):\n    return x + 1\n", "userlib")
    lib2 = _module_with("def op(x):\n    return x + 2\n", "userlib")
    user1 = _module_with("def f(x):\n    return userlib.op(x)\n", "user")
    user2 = _module_with("def f(x):\n    return userlib.op(x)\n", "user")
    user1.userlib, user2.userlib = lib1, lib2
    assert fingerprint(user1.f) != fingerprint(user2.f)


def test_unsound_values_are_refused() -> None:
    holder = _module_with("OBJ = object()\ndef f(x):\n    return OBJ\n")
    with pytest.raises(Unfingerprintable):
        fingerprint(holder.f)
    with pytest.raises(Unfingerprintable):
        fingerprint(np.array([object()]))


def test_builtin_subclass_values_count() -> None:
    mod = _module_with(
        "import typing\nclass Cfg(typing.NamedTuple):\n    k: int\nclass Tag(str):\n    pass\n"
    )
    assert fingerprint(mod.Cfg(1)) != fingerprint(mod.Cfg(2))
    assert fingerprint(mod.Tag("a")) != fingerprint(mod.Tag("b"))
    import collections

    assert fingerprint(collections.OrderedDict(a=1)) != fingerprint(collections.OrderedDict(a=2))


def test_dynamic_lookups_are_refused() -> None:
    mod = _module_with("SCALE = 2\ndef f(x):\n    return x * globals()['SCALE']\n")
    with pytest.raises(Unfingerprintable, match="globals"):
        fingerprint(mod.f)
    mod = _module_with("import importlib\ndef f(x):\n    return importlib.import_module('m')\n")
    assert fingerprint(mod.f)  # a library function: identified by name and version


def test_unknown_c_function_is_refused() -> None:
    zstandard = pytest.importorskip("zstandard")
    c_func = zstandard.get_frame_parameters
    assert isinstance(c_func, types.BuiltinFunctionType)  # C code we cannot look into
    mod = _module_with("def f(x):\n    return cfunc(x)\n")
    mod.cfunc = c_func
    with pytest.raises(Unfingerprintable, match="C function"):
        fingerprint(mod.f)
    # C functions of trusted libraries are identified by name and version
    mod.cfunc = np.add
    assert fingerprint(mod.f) == fingerprint(mod.f)


def test_stable_across_processes_and_hash_seeds(tmp_path) -> None:
    script = tmp_path / "fp.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            from cachedoctor.stablekeys.fingerprint import fingerprint
            NAMES = {"alpha", "beta", "gamma", "delta"}
            MAP = {"k": frozenset({"x", "y", "z"})}
            def f(x):
                return [n for n in NAMES if n in MAP["k"]] or x
            print(fingerprint(f))
            """
        )
    )
    src = os.path.join(os.path.dirname(os.path.dirname(__file__)), "src")
    outs = set()
    for seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": src}
        out = subprocess.run(
            [sys.executable, str(script)], env=env, capture_output=True, text=True, check=True
        )
        outs.add(out.stdout.strip())
    assert len(outs) == 1 and len(outs.pop()) == 64


def test_canonical_path() -> None:
    assert keys.canonical_path("/c/dir/xla_gpu_kernel_cache_file", "/c/dir") == (
        "<cachedoctor:cache_dir>/xla_gpu_kernel_cache_file"
    )
    assert keys.canonical_path("/c/dir/x", "/c/dir/") == "<cachedoctor:cache_dir>/x"
    assert keys.canonical_path("/c/dirx/x", "/c/dir") == "/c/dirx/x"
    assert keys.canonical_path("/other/x", "/c/dir") == "/other/x"
    assert keys.canonical_path("/c/dir/x", None) == "/c/dir/x"


def test_combine_depends_on_version_and_every_component() -> None:
    comps = [("computation", "00" * 32), ("compile_options", "11" * 32)]
    base = keys.combine(comps)
    assert len(base) == 64
    assert keys.combine(comps, hasher_version=keys.HASHER_VERSION + 1) != base
    assert keys.combine([comps[0], ("compile_options", "12" * 32)]) != base
    assert keys.combine(list(reversed(comps))) != base
