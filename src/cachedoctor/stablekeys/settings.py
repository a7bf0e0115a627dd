"""The one config file that ``cachedoctor enable`` writes, and effective-config resolution.

Location: ``$CACHEDOCTOR_CONFIG`` if set, else ``<sys.prefix>/etc/cachedoctor/config.toml`` —
per environment (a venv has its own ``sys.prefix``), like the static ``cachedoctor_startup.pth``
that reads it. Format (TOML, written by ``enable``, removed by ``disable``)::

    [cachedoctor]
    cache_dir = "/data/jax-cache"   # jax_compilation_cache_dir
    xla_caches = "autotune"         # all | autotune | kernel | none
    min_compile_time_secs = 1.0     # optional: jax_persistent_cache_min_compile_time_secs
    min_entry_size_bytes = 0        # optional: jax_persistent_cache_min_entry_size_bytes
    max_size = -1                   # optional: jax_compilation_cache_max_size (bytes)
    hook = "stable"                 # stable | observe | stats | off
    record_ir = false               # keep each module's canonical text for `diff`
    read_only = false               # hit the cache, never write to it (readonly.py)
    records_dir = "/ci/records"     # where stats records go when read-only

Precedence for every value: environment variable, then this file, then JAX's default. A command
that is given no cache directory works on the effective one (:func:`resolve_cache_dir`).
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any, NamedTuple

from cachedoctor.errors import CachedoctorError, NoCacheDirError, path_error
from cachedoctor.storage.files import write_atomic

CONFIG_ENV = "CACHEDOCTOR_CONFIG"
HOOK_ENV = "CACHEDOCTOR_HOOK"  # stable | observe | stats | off; also activates without a file
DISABLE_ENV = "CACHEDOCTOR_DISABLE"  # "1": start-up activation is skipped, the file is ignored
SECTION = "cachedoctor"
READ_ONLY_ENV = "CACHEDOCTOR_READ_ONLY"  # 1/true: hit the cache, never write to it
RECORDS_DIR_ENV = "CACHEDOCTOR_RECORDS_DIR"  # where stats records go when read-only

XLA_CACHE_CHOICES = {
    "all": "all",
    "autotune": "xla_gpu_per_fusion_autotune_cache_dir",
    "kernel": "xla_gpu_kernel_cache_file",
    "none": "none",
}
HOOK_CHOICES = ("stable", "observe", "stats", "off")


class Option(NamedTuple):
    """One setting: its key in the file, the jax config name and the environment variable.
    (Named tuples, not dataclasses, on the start-up path: ``@dataclass`` costs ~0.4 ms.)"""

    key: str
    jax_name: str | None
    env: str
    kind: type


OPTIONS: tuple[Option, ...] = (
    Option("cache_dir", "jax_compilation_cache_dir", "JAX_COMPILATION_CACHE_DIR", str),
    Option(
        "xla_caches",
        "jax_persistent_cache_enable_xla_caches",
        "JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES",
        str,
    ),
    Option(
        "min_compile_time_secs",
        "jax_persistent_cache_min_compile_time_secs",
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
        float,
    ),
    Option(
        "min_entry_size_bytes",
        "jax_persistent_cache_min_entry_size_bytes",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES",
        int,
    ),
    Option("max_size", "jax_compilation_cache_max_size", "JAX_COMPILATION_CACHE_MAX_SIZE", int),
    Option("hook", None, HOOK_ENV, str),
    Option("record_ir", None, "CACHEDOCTOR_RECORD_IR", bool),
    Option("read_only", None, READ_ONLY_ENV, bool),
    Option("records_dir", None, RECORDS_DIR_ENV, str),
)
OPTION_BY_KEY = {o.key: o for o in OPTIONS}


def config_path() -> Path:
    """Where this environment's config file is (it may not exist)."""
    override = os.environ.get(CONFIG_ENV)
    if override:
        return Path(override)
    return Path(sys.prefix) / "etc" / "cachedoctor" / "config.toml"


class ConfigError(CachedoctorError):
    slug = "config"


def load(path: Path | None = None, *, check: bool = True) -> dict[str, Any]:
    """The ``[cachedoctor]`` table of the config file, or {} when there is none.

    Raises :class:`ConfigError` naming the file (and the line) when it cannot be used: a
    folder, a FIFO, binary data, a syntax error, or (unless ``check`` is False, for ``disable``
    cleaning up after a broken file) a value of the wrong type or an unknown key.
    """
    from cachedoctor.storage.files import open_regular

    path = path or config_path()
    try:
        with open_regular(path) as f:
            raw = f.read()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise path_error(exc, path, what="config file", cls=ConfigError) from None
    import tomllib  # only now: activation by CACHEDOCTOR_HOOK alone has no file to parse

    try:
        text = raw.decode("utf-8")
        data = tomllib.loads(text)
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not UTF-8 text (a binary file?)") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: {exc}") from None
    table = data.get(SECTION, {})
    if not isinstance(table, dict):
        raise ConfigError(f"config file {path}: {SECTION} must be a [{SECTION}] table")
    if check:
        problems = _problems(data, table, key_lines(text, data))
        if problems:
            raise ConfigError(f"config file {path}: {'; '.join(p for _, p in sorted(problems))}")
    return dict(table)


def _problems(
    data: dict[str, Any], table: dict[str, Any], lines: dict[tuple[str, ...], int]
) -> list[tuple[int, str]]:
    """(line, what is wrong) of every key that is not a usable setting: one outside the
    ``[cachedoctor]`` table (nothing would read it) or a value :func:`value_problem` refuses."""
    out = []
    for key, value in data.items():
        if key != SECTION:
            line = lines.get((key,), 0)
            out.append(
                (
                    line,
                    f"{_at(line)}{_shown_key(key, value)}: outside the [{SECTION}] "
                    f"table, so nothing reads it (settings go under [{SECTION}])",
                )
            )
    for key, value in table.items():
        if (problem := value_problem(key, value)) is not None:
            line = lines.get((SECTION, key), 0)
            out.append((line, f"{_at(line)}{key} = {_shown(value)}: {problem}"))
    return out


def _at(line: int) -> str:
    return f"line {line}: " if line else ""


def _shown_key(key: str, value: Any) -> str:
    """A top-level name as the file spells it: ``[table]``, ``[[array of tables]]`` or a key."""
    if isinstance(value, dict):
        return f"[{key}]"
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return f"[[{key}]]"
    return f"{key} = {_shown(value)}"


def folder_problem(value: Any) -> str | None:
    """Why ``value`` cannot name a folder every process reads the same (None: it can)."""
    if not isinstance(value, str) or not value:
        return "expected a directory path or a gs:// / s3:// URL, as a string"
    if value.startswith("~"):
        return (
            "JAX does not expand ~: each process would write a folder named ~ in its "
            "working directory; give the absolute path"
        )
    if "://" not in value and not os.path.isabs(value):
        return "a relative path: each process would resolve it against its own folder"
    return None


def value_problem(key: str, value: Any) -> str | None:
    """Why ``value`` cannot be the setting ``key`` (None: it can): what the file may hold."""
    if key == "cache_dir":
        return folder_problem(value)
    if key == "xla_caches":
        if value not in XLA_CACHE_CHOICES:
            return f"expected one of {', '.join(XLA_CACHE_CHOICES)}"
    elif key == "hook":
        if value not in HOOK_CHOICES:
            return f"expected one of {', '.join(HOOK_CHOICES)}"
    elif key in ("record_ir", "read_only"):
        if not isinstance(value, bool):
            return "expected true or false"
    elif key == "records_dir":
        return folder_problem(value)
    elif key == "max_size":  # jax_compilation_cache_max_size: 0 stores nothing, -1 no limit
        if isinstance(value, bool) or not isinstance(value, int) or (value < 1 and value != -1):
            return (
                "expected a size in bytes > 0, or -1 for no limit (0 turns JAX's cache off: "
                "jax_compilation_cache_max_size = 0 stores nothing)"
            )
    elif key in ("min_compile_time_secs", "min_entry_size_bytes"):
        fractions = key == "min_compile_time_secs"
        expected = f"expected {'a number' if fractions else 'a whole number'} >= 0"
        if isinstance(value, bool) or not isinstance(value, (int, float) if fractions else int):
            return expected
        if not math.isfinite(value) or value < 0:
            return expected
    elif key != "created_dirs":  # created_dirs: written by enable, read by disable
        return f"not a setting (known: {', '.join(OPTION_BY_KEY)})"
    return None


def key_lines(text: str, data: dict[str, Any]) -> dict[tuple[str, ...], int]:
    """The line where each top-level name and each key of ``[cachedoctor]`` is first defined
    (tomllib gives no positions): ``(name,)`` and ``(SECTION, key)`` to a line number.

    A scan of the text that knows TOML's statements: table headers (``[a."b.c"]``,
    ``[[a]]``), dotted and quoted keys (decoded by tomllib itself), and values skipped whole
    (strings of the four kinds, multi-line ones included, arrays and inline tables across
    lines, comments), so a ``key =`` inside a string or an array is never taken for a key.
    Its names are checked against what tomllib parsed (``data``); where they differ, no line is
    given rather than a wrong one ({}).
    """
    found: dict[tuple[str, ...], int] = {}
    try:
        for path, line in _statements(text):
            for n in (1, 2):
                if len(path) >= n and (n == 1 or path[0] == SECTION):
                    found.setdefault(path[:n], line)
    except (ValueError, IndexError):
        return {}
    names = {p[0] for p in found}
    keys = {p[1] for p in found if len(p) == 2}
    table = data.get(SECTION)
    if names != set(data) or keys != set(table if isinstance(table, dict) else ()):
        return {}
    return found


_BARE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def _statements(text: str) -> list[tuple[tuple[str, ...], int]]:
    """(full key path, line) of each table header and each key/value statement."""
    out: list[tuple[tuple[str, ...], int]] = []
    table: tuple[str, ...] = ()
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in " \t\r\n":
            i += 1
        elif c == "#":
            i = _line_end(text, i)
        elif c == "[":
            line = text.count("\n", 0, i) + 1
            double = text.startswith("[[", i)
            path, i = _key(text, i + (2 if double else 1))
            i = text.index("]]" if double else "]", i) + (2 if double else 1)
            table = path
            out.append((table, line))
        else:
            line = text.count("\n", 0, i) + 1
            path, i = _key(text, i)
            if text[i] != "=":
                raise ValueError("no = after a key")
            out.append((table + path, line))
            i = _skip_value(text, i + 1)
    return out


def _line_end(text: str, i: int) -> int:
    end = text.find("\n", i)
    return len(text) if end < 0 else end


def _key(text: str, i: int) -> tuple[tuple[str, ...], int]:
    """A dotted key from ``i`` (spaces around its dots): its parts, decoded, and the index
    after it and the spaces that follow."""
    import tomllib

    parts = []
    while True:
        while text[i] in " \t":
            i += 1
        if text[i] in "\"'":
            end = _string_end(text, i)
            parts.append(str(tomllib.loads(f"k = {text[i:end]}")["k"]))
            i = end
        else:
            start = i
            while i < len(text) and text[i] in _BARE:
                i += 1
            if i == start:
                raise ValueError("not a key")
            parts.append(text[start:i])
        while i < len(text) and text[i] in " \t":
            i += 1
        if i < len(text) and text[i] == ".":
            i += 1
            continue
        return tuple(parts), i


def _string_end(text: str, i: int) -> int:
    """The index after the string that starts at ``i`` (basic or literal, one line or
    multi-line; escapes in basic strings; up to two quotes before a closing triple)."""
    q = text[i]
    if text.startswith(q * 3, i):
        end = i + 3
        while True:
            if q == '"' and text[end] == "\\":
                end += 2
            elif text.startswith(q * 3, end):
                extra = 0  # """a"""" ends with a quote in the string: at most two more
                while extra < 2 and text.startswith(q, end + 3 + extra):
                    extra += 1
                return end + 3 + extra
            else:
                end += 1
    end = i + 1
    while text[end] != q:
        if text[end] == "\n":
            raise ValueError("a string across lines")
        end += 2 if q == '"' and text[end] == "\\" else 1
    return end + 1


def _skip_value(text: str, i: int) -> int:
    """The index of the end of the line the value from ``i`` ends on: strings skipped whole,
    brackets and braces across lines counted, comments inside arrays skipped."""
    depth = 0
    n = len(text)
    while i < n:
        c = text[i]
        if c in "\"'":
            i = _string_end(text, i)
            continue
        if c in "[{":
            depth += 1
        elif c in "]}":
            depth -= 1
        elif c == "#":
            i = _line_end(text, i)
            continue
        elif c == "\n" and depth <= 0:
            return i
        i += 1
    return i


def _shown(value: Any) -> str:
    import json

    scalar = isinstance(value, bool | int | float)  # a string as JSON: a newline stays \n
    text = _toml_value(value) if scalar else json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= 60 else text[:59] + "…"


def hook_mode(values: dict[str, Any]) -> str:
    """The hook mode a process of this environment runs in: ``$CACHEDOCTOR_HOOK``, else the
    config file's, else ``stable`` when there is a file and ``stats`` when activation came from
    ``CACHEDOCTOR_READ_ONLY`` alone.

    Raises :class:`ConfigError` for a mode that is not one of :data:`HOOK_CHOICES`.
    """
    env = os.environ.get(HOOK_ENV)
    if env:
        if env not in HOOK_CHOICES:
            raise ConfigError(
                f"{HOOK_ENV}={env[:40]!r}: expected {', '.join(HOOK_CHOICES[:-1])} or "
                f"{HOOK_CHOICES[-1]}"
            )
        return env
    if "hook" not in values and not config_path().exists():
        return "stats"  # activated by CACHEDOCTOR_READ_ONLY alone: record, change no key
    return str(values.get("hook", "stable"))


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


def read_only(values: dict[str, Any]) -> bool:
    """Whether a process of this environment uses its cache read-only:
    ``$CACHEDOCTOR_READ_ONLY`` (1/true/yes/on or 0/false/no/off), else the file's ``read_only``.

    Any other value of the variable is taken as read-only (:func:`read_only_problem` says so):
    a typo must not leave a shared cache writable.
    """
    env = os.environ.get(READ_ONLY_ENV)
    if env is not None:
        return env.strip().lower() not in _FALSE  # when in doubt (a typo), read-only
    return bool(values.get("read_only", False))


def read_only_problem() -> str | None:
    """What is wrong with ``$CACHEDOCTOR_READ_ONLY`` (None: nothing): a value that is neither
    true nor false is taken as read-only, and said."""
    env = os.environ.get(READ_ONLY_ENV)
    if env is None or env.strip().lower() in _TRUE + _FALSE:
        return None
    return (
        f"{READ_ONLY_ENV}={env[:40]!r} is not 1/true/yes/on or 0/false/no/off: taken as"
        " read-only (nothing is written to the cache)"
    )


def records_dir(values: dict[str, Any]) -> str | None:
    """Where a read-only process writes its stats record (``$CACHEDOCTOR_RECORDS_DIR``, else the
    file's ``records_dir``; None: ``readonly.records_home``'s default). Raises
    :class:`ConfigError` for a relative path or ``~`` (each process would resolve it apart)."""
    env = os.environ.get(RECORDS_DIR_ENV)
    value = env if env else values.get("records_dir")
    if value is None:
        return None
    problem = folder_problem(value)
    if problem is not None:
        name = RECORDS_DIR_ENV if env else "records_dir"
        raise ConfigError(f"{name} = {_shown(value)}: {problem}")
    return str(value)


def activates() -> bool:
    """Whether a process of this environment runs start-up activation: the ``.pth`` line's own
    test (``CACHEDOCTOR_HOOK`` set, ``CACHEDOCTOR_READ_ONLY`` set to anything but false, or a
    config file), unless ``CACHEDOCTOR_DISABLE=1``."""
    if activation_disabled():
        return False
    read_only_env = os.environ.get(READ_ONLY_ENV, "").strip().lower() not in _FALSE
    return bool(os.environ.get(HOOK_ENV) or read_only_env or config_path().exists())


def activation_disabled() -> bool:
    """Whether ``CACHEDOCTOR_DISABLE=1`` turns start-up activation (and the file) off."""
    return os.environ.get(DISABLE_ENV) == "1"


def jax_value(key: str, value: Any) -> Any:
    """The value handed to jax config / the environment for a file value."""
    if key == "xla_caches":
        return XLA_CACHE_CHOICES.get(str(value), str(value))
    return value


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


def dump(values: dict[str, Any]) -> str:
    """TOML text for a settings table (only our simple scalar values)."""
    lines = [
        "# Written by `cachedoctor enable`; `cachedoctor disable` removes this file.",
        "# Environment variables override every value here.",
        f"[{SECTION}]",
    ]
    for opt in OPTIONS:
        if opt.key in values and values[opt.key] is not None:
            lines.append(f"{opt.key} = {_toml_value(values[opt.key])}")
    for key, value in values.items():
        if key not in OPTION_BY_KEY and value is not None:
            lines.append(f"{key} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def save(values: dict[str, Any], path: Path | None = None) -> Path:
    """Write the config file atomically (temp file in the same folder, then rename)."""
    path = path or config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, dump(values).encode(), mode=0o644)
    return path


def environment(values: dict[str, Any]) -> dict[str, str]:
    """Environment variables equivalent to a settings table (for ``enable --print-env``).

    For a URL cache dir with XLA's sub-caches on, JAX's own sub-caches are turned off and
    ``XLA_FLAGS`` (this process's, plus ours) points XLA at local ones: see
    :func:`url_subcache_flags`.
    """
    env = {}
    for opt in OPTIONS:
        value = values.get(opt.key)
        if value is None:
            continue
        value = jax_value(opt.key, value)
        if isinstance(value, bool):
            value = "1" if value else "0"
        env[opt.env] = str(value)
    flags = url_subcache_flags(values)
    if flags:
        env[OPTION_BY_KEY["xla_caches"].env] = "none"
        env["XLA_FLAGS"] = merge_xla_flags(os.environ.get("XLA_FLAGS", ""), flags)
    return env


def url_subcache_flags(values: dict[str, Any]) -> list[str]:
    """XLA flags that keep a ``gs://`` / ``s3://`` cache's sub-caches on a local path.

    JAX would put them inside the cache dir, and XLA opens them with plain file I/O: it cannot
    write a URL. Empty for a local cache dir or ``xla_caches = "none"``. The local path is
    ``storage.urls.subcache_dir_for(cache_dir)``, the same on every host (it is hashed into keys).
    """
    from cachedoctor.storage.location import Location

    where = Location.of_setting(str(values.get("cache_dir") or ""))
    which = str(values.get("xla_caches") or "autotune")
    local = None if where is None else where.subcache_dir
    if local is None or which == "none":
        return []
    flags = []
    if which in ("all", "autotune"):
        autotune = XLA_CACHE_CHOICES["autotune"]
        flags.append(f"--{autotune}={os.path.join(local, autotune)}")
    if which in ("all", "kernel"):
        kernel = XLA_CACHE_CHOICES["kernel"]
        flags.append(f"--{kernel}={os.path.join(local, kernel)}")
    return flags


def merge_xla_flags(existing: str, flags: list[str]) -> str:
    """``existing`` XLA_FLAGS with ``flags`` appended; an earlier value of the same flag goes."""
    names = {f.split("=", 1)[0] for f in flags}
    kept = [f for f in existing.split() if f.split("=", 1)[0] not in names]
    return " ".join([*kept, *flags])


def configured_cache_dir() -> str | None:
    """The cache directory `cachedoctor enable` configured for this environment, if any.

    None under ``CACHEDOCTOR_DISABLE=1`` (JAX would not see it either); a broken config file
    raises :class:`ConfigError`, since guessing another directory would be wrong.
    """
    if activation_disabled():
        return None
    value = load().get("cache_dir")
    return str(value) if value else None


def resolve_cache_dir(explicit: str | None) -> str:
    """The DIR argument, else ``$JAX_COMPILATION_CACHE_DIR``, else cachedoctor's configured dir."""
    if explicit:
        return explicit
    env = os.environ.get("JAX_COMPILATION_CACHE_DIR")
    if env:
        return env
    configured = configured_cache_dir()
    if configured:
        return configured
    raise NoCacheDirError(
        "no cache directory given: pass DIR, set JAX_COMPILATION_CACHE_DIR, "
        "or configure one with `cachedoctor enable --dir DIR`"
    )


def default_cache_dir(explicit: str | None) -> str | None:
    """Like :func:`resolve_cache_dir`, for commands that also take a path: None when unset."""
    try:
        return resolve_cache_dir(explicit)
    except NoCacheDirError:
        return None
