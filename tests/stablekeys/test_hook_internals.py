"""The hook's install/uninstall and its refusal to touch unexpected JAX internals (in-process)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from jax._src import cache_key as ck
from jax._src import compilation_cache as cc

from cachedoctor.stablekeys import hook, hook_replay, splithash


@pytest.fixture(autouse=True)
def _clean_hook():
    hook.uninstall()
    hook_replay._state.warned = False
    original = cc.get_cache_key
    yield
    hook.uninstall()
    hook_replay._state.warned = False
    cc.get_cache_key = original


def test_install_is_idempotent_and_uninstall_restores() -> None:
    original = cc.get_cache_key
    assert hook.install("stable") is True
    wrapper = cc.get_cache_key
    assert wrapper is not original and vars(wrapper)["__cachedoctor_original__"] is original
    assert hook.install("observe") is True
    assert cc.get_cache_key is wrapper and hook.installed_mode() == "observe"
    assert hook.uninstall() is True
    assert cc.get_cache_key is original and hook.installed_mode() is None
    assert hook.uninstall() is False


def test_unknown_signature_says_so_once_and_leaves_jax_alone(monkeypatch, capsys) -> None:
    def get_cache_key(module, devices, compile_options, backend, flag, extra):  # new parameter
        return "x"

    monkeypatch.setattr(cc, "get_cache_key", get_cache_key)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert hook.install("stable") is False
        assert hook.install("stable") is False
    assert caught == []  # no Python warning: under -W error it would be an exception
    err = capsys.readouterr().err
    assert err.count("unexpected JAX internals") == 1 and err.endswith("own keys\n")
    current: object = cc.get_cache_key
    assert current is get_cache_key
    assert hook.installed_mode() is None


def test_key_function_not_hashing_through_hashlib_is_refused(monkeypatch, capsys) -> None:
    monkeypatch.setattr(ck, "get", lambda *a, **k: "m-" + "0" * 64)
    with pytest.raises(splithash.InternalsChanged):
        splithash.check_internals()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert hook.install("stable") is False
    assert caught == [] and capsys.readouterr().err.count("cachedoctor: ") == 1


def test_fdo_sharing_keys_pass_through() -> None:
    ignore_all = getattr(ck, "IgnoreCallbacks", None)
    if ignore_all is None:
        pytest.skip("this jax has no IgnoreCallbacks")
    assert hook._ignores_everything((ignore_all.ALL,), {})
    assert not hook._ignores_everything((ignore_all.NO,), {})
    assert hook._strips_partitioning((ignore_all.CUSTOM_PARTITIONING,), {})
    assert not hook._strips_partitioning((False,), {})


def test_autotune_roles_follow_jax_s_process_id(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The wrapper gives the folder activation chose JAX's modes by JAX's process id, and
    touches no other folder; an unknown JAX is left alone with one line on stderr. (A whole
    job on a bucket: test_hook_distributed.py.)"""
    from jax._src import compiler, distributed
    from jax._src.interpreters import pxla
    from jax._src.lib import xla_client as xc  # type: ignore[attr-defined]

    from cachedoctor.stablekeys import subcache_roles

    def options_with(folder: str) -> Any:
        def get_compile_options(
            num_replicas: int, num_partitions: int, *args: Any, **kwargs: Any
        ) -> Any:
            options = xc.CompileOptions()
            options.executable_build_options.debug_options.xla_gpu_per_fusion_autotune_cache_dir = (
                folder
            )
            return options

        return get_compile_options

    monkeypatch.setattr(pxla, "get_compile_options", compiler.get_compile_options, raising=False)
    assert subcache_roles.install("/local/autotune") is False  # pxla imports it by name now
    assert "every process of a multi-process job updates it" in capsys.readouterr().err
    monkeypatch.delattr(pxla, "get_compile_options")

    for folder, expected in (("/local/autotune", ["UPDATE", "READ", "READ"]), ("/other", None)):
        fake = options_with(folder)
        monkeypatch.setattr(compiler, "get_compile_options", fake)
        untouched = [m["autotune_mode"] for m in subcache_roles.roles((0, 1, 2)).values()]
        assert subcache_roles.install("/local/autotune") is True
        assert getattr(compiler.get_compile_options, "__cachedoctor_original__", None) is fake
        found = [m["autotune_mode"] for m in subcache_roles.roles((0, 1, 2)).values()]
        assert found == (expected or untouched)
        assert distributed.global_state.process_id == 0  # put back
