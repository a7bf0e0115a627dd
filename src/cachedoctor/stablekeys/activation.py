"""Core of ``enable`` / ``disable`` / ``status``: returns reports, never prints."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cachedoctor.errors import path_error
from cachedoctor.stablekeys import settings
from cachedoctor.stablekeys.resolved import Resolved, resolve
from cachedoctor.stablekeys.settings import ConfigError
from cachedoctor.storage.location import Location

__all__ = ["ConfigError"]  # re-exported: callers catch activation.ConfigError


@dataclass(frozen=True)
class Warning_:
    """A preflight finding: what is wrong, why it matters, how to fix it."""

    code: str
    message: str
    fix: str


@dataclass(frozen=True)
class EnableReport:
    config_path: Path
    values: dict[str, Any]
    warnings: list[Warning_]
    created_cache_dir: bool
    local_subcaches: str | None = None  # a URL cache dir: where XLA's sub-caches go instead


@dataclass(frozen=True)
class DisableReport:
    config_path: Path
    removed: list[Path]
    was_enabled: bool


@dataclass(frozen=True)
class StatusReport:
    config_path: Path
    config_exists: bool
    settings: list[Resolved]
    probe: dict[str, Any]  # what a fresh interpreter reports
    roles: list[str]
    warnings: list[Warning_] = field(default_factory=list)
    disabled: bool = False  # CACHEDOCTOR_DISABLE=1: the file is ignored by every process
    # the cache dir's key manifests (local or bucket): modules per key mode, fallbacks with
    # why, and keys of processes > 0 that differ from process 0's only per process
    key_modes: dict[str, Any] | None = None

    @property
    def activation_errors(self) -> list[str]:
        """What start-up activation reported failing in the fresh interpreter."""
        startup = self.probe.get("startup") or {}
        return [str(e) for e in startup.get("errors", [])]

    @property
    def problems(self) -> list[str]:
        """Why a fresh interpreter of this environment does not run as configured (``status``
        exits 1 on any): it could not start, import jax or cachedoctor, activation failed, the
        hook or recording is off although configured, or JAX's LRU eviction lacks filelock."""
        p = self.probe
        if "error" in p:
            return [str(p["error"])]
        out = [f"activation error: {e}" for e in self.activation_errors]
        if p.get("jax_error"):
            out.append(f"cannot import jax: {p['jax_error']}")
        if p.get("cachedoctor_error"):
            out.append(f"cannot import cachedoctor: {p['cachedoctor_error']}")
        if out:
            return out
        mode = next((str(r.value) for r in self.settings if r.key == "hook"), "off")
        mode = "off" if self.disabled else mode
        if mode in ("stable", "observe") and p.get("hook") != mode:
            out.append(f"the hook is configured ({mode}) but not active")
        if mode != "off" and not p.get("stats") and p.get("startup") is not None:
            out.append(f"stats recording is configured ({mode} mode) but not active")
        max_size = (p.get("jax_config") or {}).get("jax_compilation_cache_max_size")
        if max_size not in (None, -1) and p.get("filelock") is False:
            out.append(
                f"max_size is {max_size} but the filelock package is missing in "
                f"{p.get('python')}: JAX's LRU eviction needs it, and without it JAX caches "
                "nothing (every compile warns); pip install filelock"
            )
        return out


# -- preflight ------------------------------------------------------------------------------


def _cuda_dirs() -> list[Path]:
    dirs = [os.environ.get(v) for v in ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT")]
    out = [Path(d) for d in dirs if d]
    out.append(Path("/usr/local/cuda"))
    return out


def find_nvlink() -> str | None:
    """nvlink on PATH or in the usual CUDA directories (XLA's kernel cache links with it)."""
    found = shutil.which("nvlink")
    if found:
        return found
    for d in _cuda_dirs():
        cand = d / "bin" / "nvlink"
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    return None


def _jax_has_option(name: str) -> bool | None:
    try:
        from jax._src import config
    except Exception:
        return None
    return hasattr(config, name.removeprefix("jax_")) or name in getattr(
        config.config, "_value_holders", {}
    )


def preflight(values: dict[str, Any], *, check_jax: bool = True) -> list[Warning_]:
    """Warnings for a settings table, each with its reason and fix."""
    out: list[Warning_] = []
    cache_dir = str(values.get("cache_dir") or "")
    folder = _folder(cache_dir)
    xla = str(values.get("xla_caches") or "autotune")
    if xla in ("all", "kernel") and find_nvlink() is None:
        out.append(
            Warning_(
                "kernel-cache-without-nvlink",
                "the XLA kernel cache is on but nvlink is not reachable (PATH, $CUDA_HOME/bin, "
                "/usr/local/cuda/bin): on GPU, XLA needs it to link cached kernels and "
                "compilation fails on machines without the CUDA SDK (pip CUDA has no nvlink)",
                "install the CUDA toolkit (nvlink) or use --xla-caches=autotune",
            )
        )
    if cache_dir and folder is None and xla != "none" and not settings.url_subcache_flags(values):
        out.append(
            Warning_(
                "url-cache-dir",
                f"{cache_dir} is a URL: XLA's autotune and kernel sub-caches need a local "
                "directory and will not work there",
                "use --xla-caches=none with a URL cache dir, or a local/mounted path",
            )
        )
    if folder is not None:
        path = Path(folder)
        probe = path if path.exists() else next((p for p in path.parents if p.exists()), None)
        if probe is not None and not os.access(probe, os.W_OK | os.X_OK):
            out.append(
                Warning_(
                    "not-writable",
                    f"{probe} is not writable by this user: JAX will silently not cache",
                    "choose a writable --dir or fix its permissions",
                )
            )
        if path.exists():
            mode = path.stat().st_mode
            if mode & (stat.S_IWGRP | stat.S_IWOTH) and not mode & stat.S_ISVTX:
                out.append(
                    Warning_(
                        "insecure-dir",
                        f"{path} is writable by group/others: anyone who can write there can "
                        "plant executables that this user's JAX will load and run",
                        f"chmod go-w {shlex.quote(str(path))}",
                    )
                )
    if check_jax:
        for opt in settings.OPTIONS:
            if opt.jax_name and opt.key in values and _jax_has_option(opt.jax_name) is False:
                out.append(
                    Warning_(
                        "jax-lacks-option",
                        f"the installed JAX has no {opt.jax_name}; the '{opt.key}' setting "
                        "has no effect",
                        "upgrade JAX (>= 0.4.36 has all options cachedoctor sets)",
                    )
                )
    return out


# -- enable / disable -----------------------------------------------------------------------


def previous_values() -> tuple[dict[str, Any], Warning_ | None]:
    """The config file's values for ``enable`` to build on; a broken file is replaced, saying so."""
    try:
        return settings.load(), None
    except ConfigError as exc:
        return {}, Warning_(
            "broken-config",
            f"{exc}; enable replaces it",
            "nothing: the new file below replaces it (`cachedoctor disable` removes it)",
        )


def build_values(
    *,
    existing: dict[str, Any] | None = None,
    cache_dir: str | None,
    xla_caches: str | None,
    min_compile_time: float | None,
    min_entry_size: int | None,
    max_size: int | None,
    hook: str,
    record_ir: bool,
    read_only: bool | None = None,
    records_dir: str | None = None,
) -> dict[str, Any]:
    """The settings table ``enable`` writes (or prints): its options, else ``existing``'s
    (``read_only`` too: a cache made read-only stays so until told ``False``)."""
    existing = settings.load() if existing is None else existing
    cache_dir = (
        cache_dir or existing.get("cache_dir") or os.environ.get("JAX_COMPILATION_CACHE_DIR")
    )
    if not cache_dir:
        raise ConfigError("no cache directory: pass --dir DIR (or set JAX_COMPILATION_CACHE_DIR)")
    folder = _folder(cache_dir)
    if folder is not None:
        cache_dir = str(Path(folder).expanduser().absolute())
        _check_dir_usable(cache_dir)
    values: dict[str, Any] = {
        "cache_dir": cache_dir,
        "xla_caches": xla_caches or existing.get("xla_caches") or "autotune",
        "hook": hook,
        "record_ir": record_ir,
    }
    if read_only if read_only is not None else existing.get("read_only", False):
        values["read_only"] = True
    records_dir = records_dir or existing.get("records_dir")
    if records_dir:
        where = _folder(records_dir)
        values["records_dir"] = str(Path(where).expanduser().absolute()) if where else records_dir
    for key, value in (
        ("min_compile_time_secs", min_compile_time),
        ("min_entry_size_bytes", min_entry_size),
        ("max_size", max_size),
    ):
        if value is not None:
            values[key] = value
        elif key in existing:
            values[key] = existing[key]
    _check_max_size(values.get("max_size"))
    return values


def _folder(cache_dir: str) -> str | None:
    """The local folder a cache-dir setting names (its one Location's ``local_path``: a
    ``file://`` URL is the folder it names, as JAX's ``lru_cache`` reads it); None when unset,
    a bucket or a scheme cachedoctor does not read."""
    where = Location.of_setting(cache_dir)
    return None if where is None else where.local_path


def has_filelock() -> bool:
    """Whether JAX's ``import filelock`` (``jax/_src/lru_cache.py``) succeeds here."""
    try:
        import filelock  # noqa: F401
    except ImportError:
        return False
    return True


def _check_max_size(max_size: int | None) -> None:
    """Refuse a size limit this environment's JAX cannot honour (it would break every compile's
    cache write, not just eviction: ``jax/_src/lru_cache.py`` raises without filelock)."""
    if max_size is None or max_size == -1:
        return
    if max_size == 0:
        raise ConfigError(
            "--max-size 0 turns JAX's cache off (jax_compilation_cache_max_size = 0 disables "
            "caching): give a size such as 50GB, or leave --max-size out for no limit",
            slug="usage",
        )
    if not has_filelock():
        raise ConfigError(
            f"--max-size needs the filelock package in {sys.prefix}: JAX's LRU eviction locks "
            "the cache with it, and without it every compile warns and nothing is cached; "
            f"`{sys.executable} -m pip install filelock`, or leave --max-size out",
            slug="needs-filelock",
        )


def _check_dir_usable(cache_dir: str) -> None:
    """Refuse a cache dir that names a file, or lies under one or under a folder we cannot enter."""
    for p in [Path(cache_dir), *Path(cache_dir).parents]:
        try:
            st = p.stat()
        except FileNotFoundError:
            continue
        except OSError as exc:
            under = "" if p == Path(cache_dir) else f"the cache directory {cache_dir} is under it"
            raise path_error(exc, p, verb="use", cls=ConfigError, hint=under) from None
        if not stat.S_ISDIR(st.st_mode):
            raise ConfigError(f"cannot use {cache_dir}: {p} is not a directory")
        if not os.access(p, os.X_OK):
            raise ConfigError(f"cannot use {cache_dir}: this user cannot enter {p}")
        return


def _missing_dirs(path: Path) -> list[Path]:
    """``path`` and its ancestors that do not exist yet, outermost first."""
    missing = []
    for p in [path, *path.parents]:
        if p.exists():
            break
        missing.append(p)
    return list(reversed(missing))


def enable(values: dict[str, Any]) -> EnableReport:
    """Write the config file (activating every new Python process of this environment).

    Folders it creates are listed in the file (``created_dirs``) so that ``disable`` can remove
    exactly those again, when they are empty.
    """
    warnings = preflight(values)
    path = settings.config_path()
    try:
        previous = settings.load(path, check=False).get("created_dirs", "")
    except ConfigError:
        previous = ""  # a broken file is replaced (enable's caller said so)
    if path.is_dir():
        raise ConfigError(f"config file {path} is a directory; set {settings.CONFIG_ENV} to a file")
    created_dirs = [Path(p) for p in str(previous).split(os.pathsep) if p]
    cache_dir = str(values["cache_dir"])
    created = False
    folder = _folder(cache_dir)
    if folder is not None and not Path(folder).exists() and not values.get("read_only"):
        created_dirs += _missing_dirs(Path(folder))
        try:
            Path(folder).mkdir(parents=True, mode=0o755)
            created = True
        except OSError as exc:
            raise path_error(exc, folder, verb="create", cls=ConfigError) from exc
    created_dirs += _missing_dirs(path.parent)
    values = {**values, "created_dirs": os.pathsep.join(dict.fromkeys(map(str, created_dirs)))}
    if not values["created_dirs"]:
        del values["created_dirs"]
    try:
        settings.save(values, path)
    except OSError as exc:
        hint = f"set {settings.CONFIG_ENV} to another file"
        raise path_error(
            exc, path, what="config file", verb="write", cls=ConfigError, hint=hint
        ) from exc
    return EnableReport(path, values, warnings, created, local_subcaches(values))


def local_subcaches(values: dict[str, Any]) -> str | None:
    """The local folder of XLA's sub-caches for a URL cache dir (None: JAX's own layout)."""
    if not settings.url_subcache_flags(values):
        return None
    from cachedoctor.storage.urls import subcache_dir_for

    return subcache_dir_for(str(values["cache_dir"]))


def disable() -> DisableReport:
    """Remove what ``enable`` added: the config file, and the folders it created if empty."""
    path = settings.config_path()
    removed: list[Path] = []
    if not os.path.lexists(path):
        return DisableReport(path, removed, False)
    if path.is_dir() and not path.is_symlink():
        raise ConfigError(
            f"{path} is a directory, not a config file: nothing to disable there "
            f"(unset {settings.CONFIG_ENV} or point it at a file)"
        )
    try:
        created = str(settings.load(path, check=False).get("created_dirs", ""))
    except ConfigError:
        created = ""  # a broken file still goes; the folders it named cannot be known
    try:
        path.unlink()
    except OSError as exc:
        raise path_error(exc, path, what="config file", verb="remove", cls=ConfigError) from exc
    removed.append(path)
    for folder in sorted((Path(p) for p in created.split(os.pathsep) if p), reverse=True):
        try:
            folder.rmdir()  # only when empty: cache entries are never deleted
            removed.append(folder)
        except OSError:
            continue
    return DisableReport(path, removed, True)


SHELLS = ("sh", "fish", "github", "dotenv")


def format_env(env: dict[str, str], shell: str) -> str:
    """Environment assignments for a shell, GitHub Actions ($GITHUB_ENV) or a .env file."""
    lines = []
    for name, value in env.items():
        if shell == "sh":
            lines.append(f"export {name}={shlex.quote(value)}")
        elif shell == "fish":
            lines.append(f"set -gx {name} {shlex.quote(value)}")
        elif shell == "github":
            if "\n" in value:
                raise ConfigError(f"{name} contains a newline; cannot write it to $GITHUB_ENV")
            lines.append(f"{name}={value}")
        elif shell == "dotenv":
            escaped = value.replace("\\", "\\\\").replace('"', '\\"')
            lines.append(f'{name}="{escaped}"')
        else:
            raise ConfigError(f"unknown shell {shell!r} (choose from {', '.join(SHELLS)})")
    return "\n".join(lines) + "\n"


# -- status ---------------------------------------------------------------------------------

_PROBE = r"""
import json, os, sys
out = {"python": sys.executable}
try:
    import jax
    from jax._src import config
    out["jax"] = jax.__version__
    vals = {}
    for name in ("jax_compilation_cache_dir", "jax_persistent_cache_enable_xla_caches",
                 "jax_persistent_cache_min_compile_time_secs",
                 "jax_persistent_cache_min_entry_size_bytes", "jax_compilation_cache_max_size"):
        h = config.config._value_holders.get(name)
        vals[name] = None if h is None else h.value
    out["jax_config"] = vals
except Exception as exc:
    out["jax_error"] = f"{type(exc).__name__}: {exc}"
try:
    import filelock  # as jax/_src/lru_cache.py imports it
    out["filelock"] = True
except ImportError:
    out["filelock"] = False
try:
    from cachedoctor.stablekeys import _startup, hook, stats_record
    out["startup"] = _startup.STATE
    out["hook"] = hook.installed_mode()
    out["stats"] = stats_record.recording()
    out["pth"] = [p for p in sys.path if os.path.exists(os.path.join(p, "cachedoctor_startup.pth"))]
except Exception as exc:
    out["cachedoctor_error"] = f"{type(exc).__name__}: {exc}"
try:  # what JAX's get_compile_options gives process 0 and process 1 (the sub-cache roles)
    from cachedoctor.stablekeys import subcache_roles
    out["roles"] = subcache_roles.roles((0, 1))
except Exception as exc:
    out["roles_error"] = f"{type(exc).__name__}: {exc}"
print("CACHEDOCTOR-PROBE " + json.dumps(out, default=str))
"""

ROLES = [
    "process 0 writes cache entries and updates the autotune sub-cache (UPDATE mode)",
    "processes 1..N-1 only read entries and the autotune sub-cache (READ mode)",
    "the kernel cache file has no per-process mode: every process may append to it",
]


def observed_roles(probe: dict[str, Any]) -> tuple[list[str], list[Warning_]]:
    """The multi-host roles in force, from the fresh interpreter's ``get_compile_options`` as
    process 0 and as process 1; the fixed description when it could not say."""
    found = probe.get("roles") or {}
    first, other = found.get("0"), found.get("1")
    if not first or not other:
        why = probe.get("roles_error") or probe.get("error") or "no answer"
        return [*ROLES, f"(JAX's compile options could not be asked: {why})"], []
    read_only = ((probe.get("startup") or {}).get("read_only") or {}).get("installed")
    lines = [
        "read-only: no process writes cache entries (JAX's put stores nothing)"
        if read_only
        else "JAX writes cache entries only from process 0"
    ]
    warnings: list[Warning_] = []
    folder = first["autotune_dir"]
    if folder is None:
        lines.append("autotune sub-cache: off")
    else:
        lines.append(
            f"autotune sub-cache {folder}: process 0 {first['autotune_mode']}, "
            f"processes 1..N-1 {other['autotune_mode']} (JAX's compile options, as each)"
        )
        if other["autotune_mode"] != "READ":
            warnings.append(
                Warning_(
                    "autotune-roles",
                    f"processes other than 0 get the autotune sub-cache in"
                    f" {other['autotune_mode']} mode: every process of a job writes {folder}"
                    " (JAX gives them READ)",
                    "let cachedoctor's activation set the cache dir (`cachedoctor enable`), or"
                    " pass --xla_gpu_experimental_autotune_cache_mode=read to processes > 0",
                )
            )
    kernel = first["kernel_cache_file"]
    lines.append(
        "kernel cache file: off"
        if kernel is None
        else f"kernel cache file {kernel}: no per-process mode, every process may append to it"
    )
    from cachedoctor.storage.location import Location

    for path in (folder, kernel):
        where = Location.of_setting(path)
        if path is not None and where is not None and where.url is not None:
            warnings.append(
                Warning_(
                    "subcache-url",
                    f"XLA is given {path}: it opens sub-caches with plain file I/O",
                    "`cachedoctor enable --dir URL` keeps XLA's sub-caches on a local path",
                )
            )
    return lines, warnings


def probe(python: str | None = None, timeout: float = 120.0) -> dict[str, Any]:
    """Start a fresh interpreter of this environment and ask what it has activated."""
    try:
        proc = subprocess.run(
            [python or sys.executable, "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": f"could not start a fresh interpreter: {exc}"}
    for line in proc.stdout.splitlines():
        if line.startswith("CACHEDOCTOR-PROBE "):
            data: dict[str, Any] = json.loads(line.split(" ", 1)[1])
            return data
    return {"error": f"fresh interpreter failed (exit {proc.returncode}): {proc.stderr[-500:]}"}


def status(python: str | None = None) -> StatusReport:
    path = settings.config_path()
    disabled = settings.activation_disabled()
    values = {} if disabled else settings.load(path)
    resolved = resolve(values)
    fresh = probe(python)
    jax_cfg = fresh.get("jax_config") or {}
    filled = []
    for r in resolved:
        opt = settings.OPTION_BY_KEY[r.key]
        if r.value is None and opt.jax_name:
            filled.append(Resolved(r.key, jax_cfg.get(opt.jax_name), r.source))
        elif r.value is None and r.key == "hook":
            # start-up activation runs when the file exists, even empty (stable by default),
            # or by CACHEDOCTOR_READ_ONLY alone (stats)
            hook = settings.hook_mode(values) if settings.activates() else "off"
            filled.append(Resolved(r.key, hook, r.source))
        else:
            filled.append(r)
    warnings = preflight(values, check_jax=False) if values else []
    roles, role_warnings = observed_roles(fresh)
    cache_dir = next((r.value for r in filled if r.key == "cache_dir"), None)
    return StatusReport(
        path,
        path.exists(),
        filled,
        fresh,
        roles,
        warnings + role_warnings,
        disabled,
        _key_modes(cache_dir),
    )


def _key_modes(cache_dir: object) -> dict[str, Any] | None:
    """Key modes from the cache dir's manifests (local or a bucket: one listing, then the
    manifests read concurrently), and the keys of processes > 0 that differ from process 0's
    only in what JAX hashes per process; None without a readable cache dir."""
    from cachedoctor.stablekeys import manifest, processes

    if not cache_dir:
        return None
    where = Location.of_setting(cache_dir)
    try:
        found = [] if where is None else list(manifest.iter_manifests(where))
    except Exception:  # an unreachable bucket, no permission: status still reports the rest
        return None
    summary = manifest.key_mode_summary(found)
    summary["per_process"] = [
        {**asdict(k), "line": k.line()} for k in processes.per_process_keys(found)
    ]
    return summary
