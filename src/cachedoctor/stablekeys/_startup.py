"""Start-up activation, run by the static ``cachedoctor_startup.pth`` shipped in the wheel.

The ``.pth`` line only checks, with no import, whether this environment has a config file (or
``CACHEDOCTOR_HOOK`` is set); only then does it import this small module, which puts a one-shot
watcher on ``sys.meta_path``. Nothing else happens until the process imports ``jax``: right after
``jax`` has executed, the config file's settings are applied (environment variables win, since
JAX reads them itself) and the hook is installed. Every step is guarded: a failure here must
never stop a Python process from starting, and it is said once on stderr (a process must not
silently run without the cache it was configured for). Set ``CACHEDOCTOR_DISABLE=1`` to skip it all.
"""

from __future__ import annotations

import os
import sys

# What activation did in this process, for `cachedoctor status` (None: not activated).
STATE: dict[str, object] | None = None


class _JaxWatcher:
    """A meta-path finder that wraps the ``jax`` loader, and removes itself once ``jax`` has
    executed: a program (or a library checking what is installed) may ask
    ``importlib.util.find_spec("jax")`` without importing it, which must not disarm it."""

    busy = False  # finding jax's own spec below goes through sys.meta_path, this one included

    def find_spec(self, name: str, path: object = None, target: object = None) -> object:
        if name != "jax" or _JaxWatcher.busy:
            return None
        try:
            import importlib.util

            _JaxWatcher.busy = True
            try:
                spec = importlib.util.find_spec(name)
            finally:
                _JaxWatcher.busy = False
            loader = getattr(spec, "loader", None)
            exec_module = getattr(loader, "exec_module", None)
            if spec is None or exec_module is None:
                return spec

            def exec_and_activate(module: object) -> None:
                _remove_watcher()
                exec_module(module)
                activate()

            loader.exec_module = exec_and_activate  # type: ignore[union-attr]
            return spec
        except Exception:
            _remove_watcher()
            return None


def _remove_watcher() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _JaxWatcher)]


def startup() -> None:
    """Entry point of the ``.pth`` line: cheap, idempotent, silent."""
    if os.environ.get("CACHEDOCTOR_DISABLE") == "1":  # settings.DISABLE_ENV (not imported: cheap)
        return
    if "jax" in sys.modules:
        activate()
        return
    if not any(isinstance(f, _JaxWatcher) for f in sys.meta_path):
        sys.meta_path.insert(0, _JaxWatcher())  # type: ignore[arg-type]


def activate() -> dict[str, object]:
    """Apply the config file to jax and install the hook; never raises."""
    global STATE
    if STATE is not None:
        return STATE
    applied: dict[str, object] = {}
    errors: list[str] = []
    state: dict[str, object] = {"applied": applied, "errors": errors, "hook": None}
    STATE = state
    try:
        from cachedoctor.stablekeys import settings

        state["config"] = str(settings.config_path())
        values = settings.load()  # checked: a wrong-typed value stops activation here, named
        mode = settings.hook_mode(values)  # before anything is applied: all or nothing
        read_only = settings.read_only(values)
        if read_only:  # first: nothing below may write before the cache is read-only
            state["read_only"] = _read_only(values, errors)
        local_subcaches = _apply_settings(values, applied, errors)
        autotune = None
        if local_subcaches:
            state["xla_flags"] = local_subcaches
            values = {**values, "xla_caches": "none"}  # XLA_FLAGS names local ones instead
            autotune = _flag_value(local_subcaches, "--xla_gpu_per_fusion_autotune_cache_dir")
        if autotune or (read_only and _xla_caches() not in (None, "none")):
            from cachedoctor.stablekeys import subcache_roles

            # JAX's per-process modes, which its own branch no longer sets; READ everywhere
            # when read-only
            state["autotune_roles"] = subcache_roles.install(autotune, read_only=read_only)
        record_ir = os.environ.get("CACHEDOCTOR_RECORD_IR", "") in ("1", "true") or bool(
            values.get("record_ir", False)
        )
        verify_dir = os.environ.get("CACHEDOCTOR_VERIFY_FRESH")  # verify_run.VERIFY_FRESH_ENV
        if verify_dir:  # check --verify's run: fresh compiles go there; no record of its own
            from cachedoctor.stablekeys import verify_run

            state["verify"] = verify_run.install(verify_dir)
            mode = "stable" if mode == "stable" else "off"  # stable keys are what it looks up
        if mode != "off" and not verify_dir:
            from cachedoctor.stablekeys import stats, stats_record

            state["stats"] = stats.start(mode, stats_record.keep_ahead_of_the_pools)
            if state["stats"]:
                stats_record.write_at_exit()
        if mode not in ("off", "stats"):
            from cachedoctor.stablekeys import hook

            writes = not read_only  # read-only: no manifest, no re-keyed entry
            if hook.install(mode, record_ir=record_ir, manifests=writes, migrate=writes):
                state["hook"] = mode
    except Exception as exc:
        named = type(exc).__name__ == "ConfigError"  # already names the file and the line
        errors.append(str(exc) if named else f"{type(exc).__name__}: {exc}")
    if errors:  # said once (STATE makes activation run once): never a silently lost cache
        _say(
            f"cachedoctor: start-up activation failed: {'; '.join(errors)}; this process "
            "runs with JAX's own settings for what failed (see `cachedoctor status`)\n"
        )
    return state


def _say(text: str) -> None:
    """Write to stderr, never raising (a closed stderr must not stop a process). Not
    ``contextlib.suppress``: the ``.pth`` line imports this module in every Python process of
    an activated environment, and ``contextlib`` brings ``collections`` and ``functools``."""
    try:  # noqa: SIM105
        sys.stderr.write(text)
    except Exception:
        pass


def _read_only(values: dict[str, object], errors: list[str]) -> dict[str, object]:
    """Make JAX's cache read-only here (``readonly.py``); what :func:`activate` keeps of it."""
    from cachedoctor.stablekeys import readonly, settings

    said = [settings.read_only_problem(), *readonly.subcache_warnings(_xla_caches(values))]
    for line in filter(None, said):
        _say(f"cachedoctor: read-only: {line}\n")
    try:
        records = settings.records_dir(values)
    except Exception as exc:  # the record goes to the default folder; the cache stays read-only
        errors.append(str(exc))
        records = None
    return {"installed": readonly.install(records), "records_dir": records}


def _xla_caches(values: dict[str, object] | None = None) -> str | None:
    """``jax_persistent_cache_enable_xla_caches`` as a process of this environment has it."""
    from cachedoctor.stablekeys import settings

    env = os.environ.get(settings.OPTION_BY_KEY["xla_caches"].env)
    if env:
        return env
    if values and "xla_caches" in values:
        return str(settings.jax_value("xla_caches", values["xla_caches"]))
    try:
        from jax._src import config

        return str(config.persistent_cache_enable_xla_caches.value)
    except Exception:
        return None


def _apply_settings(
    values: dict[str, object], applied: dict[str, object], errors: list[str]
) -> list[str]:
    """The settings' part of activation: XLA_FLAGS for a URL cache's local sub-caches, and the
    config file's values handed to jax.config (environment variables win). Returns those
    flags."""
    import jax

    from cachedoctor.stablekeys import settings

    local_subcaches = _keep_subcaches_local(values)
    if local_subcaches:
        values = {**values, "xla_caches": "none"}  # XLA_FLAGS names local ones instead
    for opt in settings.OPTIONS:
        if opt.jax_name is None or opt.key not in values or os.environ.get(opt.env):
            continue
        value = opt.kind(settings.jax_value(opt.key, values[opt.key]))
        try:
            jax.config.update(opt.jax_name, value)  # type: ignore[no-untyped-call]
            applied[opt.jax_name] = value
        except Exception as exc:  # an option this JAX lacks
            errors.append(f"{opt.jax_name}: {exc}")
    return local_subcaches


def as_a_job_starts() -> list[str]:
    """In cachedoctor's own process (which never activates), give JAX the settings a job's
    process of this environment starts with: what activation applies, without the hook or the
    recorder (``preflight`` asks JAX what it would hash). Nothing when this environment does
    not activate. Returns the errors activation would report."""
    from cachedoctor.stablekeys import settings

    if not settings.activates():
        return []
    errors: list[str] = []
    try:
        _apply_settings(settings.load(), {}, errors)
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
    return errors


def _keep_subcaches_local(values: dict[str, object]) -> list[str]:
    """A ``gs://`` / ``s3://`` cache dir: point XLA's sub-caches at a local path via XLA_FLAGS.

    Runs right after ``import jax``, before any backend exists, so XLA reads these flags.
    The cache dir is the effective one (the environment's, else the file's); nothing happens
    when the environment chooses the sub-caches itself.
    """
    from cachedoctor.stablekeys import settings as s

    if os.environ.get(s.OPTION_BY_KEY["xla_caches"].env):
        return []
    env_dir = os.environ.get(s.OPTION_BY_KEY["cache_dir"].env)
    flags = s.url_subcache_flags({**values, **({"cache_dir": env_dir} if env_dir else {})})
    if flags:
        os.environ["XLA_FLAGS"] = s.merge_xla_flags(os.environ.get("XLA_FLAGS", ""), flags)
    return flags


def _flag_value(flags: list[str], name: str) -> str | None:
    for flag in flags:
        if flag.startswith(name + "="):
            return flag.split("=", 1)[1]
    return None
