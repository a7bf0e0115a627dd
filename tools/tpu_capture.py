#!/usr/bin/env python3
"""Capture real TPU cache entries, with JAX's own verdict on each, for cachedoctor's tests.

Run on a TPU machine (the device tool's tpu-v5e), from the repository root, with the Python that
has JAX and libtpu. cachedoctor's own dependencies travel as wheels (``--wheels .whl-tpu``, the
device README's recipe); the script puts them and this checkout's ``src/`` into a virtual
environment over the machine's JAX, with the start-up ``.pth``, so that ``CACHEDOCTOR_HOOK`` works
in the programs it starts:

    PYTHONUNBUFFERED=1 python3 tools/tpu_capture.py --out "$OUT" --wheels .whl-tpu

Steps (``--steps``, all by default):

- ``moved``: one program with two Pallas TPU kernels (an add, a tiled bf16 matmul) and a plain
  ``jnp`` step, run five times into one cache, each in a fresh process: from folder ``a``, from a
  copy in folder ``b``, from ``a`` with one comment line added above the kernels, from ``a`` as it
  was, and from ``a`` with the add kernel's body changed. JAX's log of every run is kept
  (``JAX_EXPLAIN_CACHE_MISSES``), with each module's hit or miss and the program's results.
- ``moved-stable``: the same five runs with ``CACHEDOCTOR_HOOK=stable``.
- ``damage``: a fresh cache of the same program; copies of its ``jit_add`` (Pallas) and
  ``jit_step`` entries are damaged in named ways (cut short, a byte zstd rejects, broken
  messages, a byte in debug text, random bytes away from the machine code), and JAX loads each
  one in turn in a worker process: ``damage.json`` says what JAX did (hit with the right
  result, an error and its text, or a crash), and ``variants/`` holds the bytes.
- ``commands``: cachedoctor's commands on the captured caches (``commands.json``).

Everything lands in ``--out``: ``capture.tar.gz`` (caches, programs, logs, variants) and the
JSON files. The device returns at most 8 files, so nothing else is written there.
Without a TPU, ``JAX_PLATFORMS=cpu`` runs no step (the programs need ``pallas_call`` on a TPU);
``tests/e2e/test_tpu_capture.py`` checks that the script imports and builds its variants.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

STEPS = ("moved", "moved-stable", "damage", "commands", "prune-damage", "load-failures")
WORK = Path("/tmp/tpucap")

# The program: two Pallas TPU kernels and a plain step. {comment} and {add_rhs} vary per run.
PROGRAM = '''\
"""cachedoctor's TPU capture program (tools/tpu_capture.py)."""
import json, logging, os, re, warnings
import jax
jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
if os.environ.get("CAPTURE_PRECISION"):
    jax.config.update("jax_default_matmul_precision", os.environ["CAPTURE_PRECISION"])
import jax.numpy as jnp
from jax.experimental import pallas as pl

OUTCOMES = []
INTERPRET = jax.default_backend() == "cpu"  # a dry run of this script without a TPU
_PATTERNS = (
    ("hit", re.compile(r"Persistent compilation cache hit for '(.+?)' with key '?([^' ]+)")),
    ("miss", re.compile(r"PERSISTENT COMPILATION CACHE MISS for '(.+?)' with key '?([^' ]+)")),
)


class _Outcomes(logging.Handler):
    def emit(self, record):
        text = record.getMessage()
        for kind, pattern in _PATTERNS:
            found = pattern.search(text)
            if found:
                OUTCOMES.append([kind, found.group(1), found.group(2)])


_logger = logging.getLogger("jax._src.compiler")
_logger.setLevel(logging.DEBUG)
_logger.addHandler(_Outcomes())
_shown = logging.StreamHandler()  # JAX's own warnings, as without our handler
_shown.setLevel(logging.WARNING)
_logger.addHandler(_shown)
logging.getLogger("jax._src.compilation_cache").addHandler(_Outcomes())
{comment}
def add_kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] + {add_rhs}


@jax.jit
def add(x, y):
    return pl.pallas_call(
        add_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=INTERPRET
    )(x, y)


def mm_kernel(x_ref, y_ref, o_ref):
    @pl.when(pl.program_id(2) == 0)
    def _():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)


@jax.jit
def matmul(x, y):
    m, k = x.shape
    _, n = y.shape
    bm = bn = bk = 256
    return pl.pallas_call(
        mm_kernel,
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
        grid=(m // bm, n // bn, k // bk),
        in_specs=[
            pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
            pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        interpret=INTERPRET,
    )(x, y)


@jax.jit
def step(w, x):
    return jnp.tanh(x @ w).sum()


def inputs():
    x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128) / 1024
    a = jnp.ones((512, 512), jnp.bfloat16)
    w = jnp.ones((128, 128), jnp.float32) / 128
    return jax.block_until_ready((x, a, w))


def run(only=None):
    x, a, w = inputs()
    calls = {{
        "add": lambda: float(add(x, x).sum()),
        "matmul": lambda: float(matmul(a, a)[0, 0]),
        "step": lambda: float(step(w, x)),
    }}
    return {{name: call() for name, call in calls.items() if only in (None, name)}}


if __name__ == "__main__":
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = run()
    errors = [str(w.message) for w in caught if "persistent compilation cache" in str(w.message)]
    print("CAPTURE " + json.dumps({{"results": results, "outcomes": OUTCOMES, "errors": errors}}))
'''

COMMENT = "# one comment line added above the kernels: every line below moves down by one\n"
ADD_RHS, ADD_RHS_CHANGED = "y_ref[...]", "y_ref[...] * 2"

# (name, folder, comment, add_rhs): the five runs of the moved steps, in order
RUNS = (
    ("a", "a", "", ADD_RHS),
    ("b", "b", "", ADD_RHS),
    ("a-comment", "a", COMMENT, ADD_RHS),
    ("a-again", "a", "", ADD_RHS),
    ("a-body", "a", "", ADD_RHS_CHANGED),
)


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


# --- the environment ---------------------------------------------------------------------------


def make_env(wheels: Path | None) -> Path:
    """A virtual environment over this machine's JAX with cachedoctor's wheels and this
    checkout's src/ (an editable-style .pth) and the start-up .pth; returns its python."""
    venv = WORK / "venv"
    python = venv / "bin" / "python"
    if python.exists():
        return python
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)],
        check=True,
    )
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    if wheels is not None:
        found = sorted(p for p in wheels.glob("*.whl") if not p.name.startswith("cachedoctor-"))
        env = dict(os.environ, PIP_CONFIG_FILE="/dev/null")
        cmd = [sys.executable, "-m", "pip", "install", "--isolated", "-q", "--no-index"]
        cmd += ["--no-deps", "--no-compile", "--upgrade", "--target", str(site)]
        subprocess.run([*cmd, *map(str, found)], check=True, env=env)
    (site / "cachedoctor-src.pth").write_text(str(ROOT / "src") + "\n")
    shutil.copy(ROOT / "src" / "cachedoctor_startup.pth", site / "cachedoctor_startup.pth")
    return python


def environment(python: Path) -> dict[str, object]:
    probe = (
        "import json, jax, jaxlib; d = jax.devices()[0]; "
        "v = {'jax': jax.__version__, 'jaxlib': jaxlib.__version__, 'device_kind': d.device_kind,"
        " 'platform': d.platform, 'devices': len(jax.devices())}\n"
        "try:\n import libtpu; v['libtpu'] = getattr(libtpu, '__version__', '?')\n"
        "except Exception as e: v['libtpu'] = repr(e)\n"
        "import cachedoctor; v['cachedoctor'] = cachedoctor.__file__\n"
        "print(json.dumps(v))"
    )
    out = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
    if out.returncode:
        return {"error": out.stderr[-2000:]}
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


# --- the program runs --------------------------------------------------------------------------


def write_program(folder: str, comment: str, add_rhs: str) -> Path:
    path = WORK / "progs" / folder / "capture_prog.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(PROGRAM.format(comment=comment, add_rhs=add_rhs))
    return path


def run_program(
    python: Path, program: Path, cache: Path, logfile: Path, extra_env: dict[str, str]
) -> dict[str, object]:
    """One fresh process of the program; what it printed of its hits, misses and results."""
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(cache), JAX_EXPLAIN_CACHE_MISSES="1")
    env.pop("CACHEDOCTOR_HOOK", None)
    env.update(extra_env)
    started = time.monotonic()
    done = subprocess.run(
        [str(python), str(program)], cwd=program.parent, env=env, capture_output=True, text=True
    )
    text = done.stdout + done.stderr
    logfile.parent.mkdir(parents=True, exist_ok=True)
    logfile.write_text(text)
    found: dict[str, object] = {"rc": done.returncode, "seconds": round(time.monotonic() - started)}
    for line in done.stdout.splitlines():
        if line.startswith("CAPTURE "):
            found.update(json.loads(line[len("CAPTURE ") :]))
    if done.returncode:
        found["tail"] = text[-3000:]
    return found


def moved_step(python: Path, name: str, extra_env: dict[str, str]) -> dict[str, object]:
    cache = WORK / "caches" / name
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True)
    runs = {}
    for run_name, folder, comment, add_rhs in RUNS:
        program = write_program(folder, comment, add_rhs)
        shutil.copy(program, WORK / "programs" / f"capture_prog-{run_name}.py")
        found = run_program(
            python, program, cache, WORK / "logs" / f"{name}-{run_name}.log", extra_env
        )
        runs[run_name] = found
        log(f"{name} {run_name}: {summarise(found)}")
    write_program("a", "", ADD_RHS)  # a as it was, for the later steps
    entries = sorted(p.name for p in cache.iterdir() if p.name.endswith("-cache"))
    return {"runs": runs, "entries": entries}


def summarise(found: dict[str, object]) -> str:
    outcomes = found.get("outcomes") or []
    per: dict[str, list[str]] = {}
    for kind, module, _key in outcomes:  # type: ignore[misc]
        per.setdefault(kind, []).append(module)
    parts = [f"{k} {sorted(v)}" for k, v in sorted(per.items())]
    return f"rc {found.get('rc')}, {'; '.join(parts)}, results {found.get('results')}"


# --- damaged entries, and what JAX does with each ----------------------------------------------


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        if not byte & 0x80:
            return value, pos
        shift += 7


def chunks_of(raw: bytes) -> list[tuple[int, int]]:
    """(start, end) of the header and each length-delimited message after the 4-byte prefix."""
    out, pos = [], 4
    while pos < len(raw):
        length, start = _varint(raw, pos)
        out.append((start, start + length))
        pos = start + length
    return out


def _fields(data: bytes, base: int) -> list[tuple[int, int, int, int]]:
    """(number, wire type, start, end) of the top-level fields of a message at ``base``."""
    out, pos = [], 0
    while pos < len(data):
        tag, pos = _varint(data, pos)
        number, wt = tag >> 3, tag & 7
        if wt == 0:
            _, end = _varint(data, pos)
            out.append((number, wt, base + pos, base + end))
            pos = end
        elif wt == 2:
            length, start = _varint(data, pos)
            out.append((number, wt, base + start, base + start + length))
            pos = start + length
        elif wt in (1, 5):
            size = 8 if wt == 1 else 4
            out.append((number, wt, base + pos, base + pos + size))
            pos += size
        else:
            raise ValueError(f"wire type {wt}")
    return out


def variants_of(compressed: bytes, seed: int) -> list[tuple[str, str, bytes]]:
    """(name, what was done, the file's bytes) for one healthy entry: each a way to damage it."""
    import zstandard

    raw = zstandard.ZstdDecompressor().decompressobj().decompress(compressed)
    chunks = chunks_of(raw)
    out: list[tuple[str, str, bytes]] = []

    def recompressed(name: str, what: str, data: bytes | bytearray) -> None:
        out.append((name, what, zstandard.ZstdCompressor(level=3).compress(bytes(data))))

    def set_byte(name: str, what: str, at: int, value: int) -> None:
        data = bytearray(raw)
        data[at] = value
        recompressed(
            name, f"{what} (byte {at} of the payload: {raw[at]:#04x} -> {value:#04x})", data
        )

    out.append(("cut-half", "the file cut to half its length", compressed[: len(compressed) // 2]))
    out.append(("cut-last-byte", "the file's last byte cut", compressed[:-1]))
    rng = random.Random(seed)
    rejected = silent = 0
    for _ in range(4000):
        at = rng.randrange(4, len(compressed))
        bad = bytearray(compressed)
        bad[at] ^= 1 << rng.randrange(8)
        try:
            decoded = zstandard.ZstdDecompressor().decompressobj().decompress(bytes(bad))
        except zstandard.ZstdError:
            if rejected < 2:
                rejected += 1
                out.append(
                    (
                        f"zstd-rejects-{rejected}",
                        f"bit flipped in compressed byte {at}: zstd refuses",
                        bytes(bad),
                    )
                )
            continue
        if decoded != raw and silent < 3:
            changed = [i for i, (p, q) in enumerate(zip(decoded, raw, strict=False)) if p != q]
            if len(decoded) != len(raw) or not changed or changed[0] < chunks[1][1]:
                continue  # only changes after message 0 (the TPU program) are loaded on a chip
            silent += 1
            where = changed[0]
            out.append(
                (
                    f"zstd-silent-{silent}",
                    f"bit flipped in compressed byte {at}: the frame decodes whole, first"
                    f" change at payload byte {where} of {len(raw)}",
                    bytes(bad),
                )
            )
        if rejected >= 2 and silent >= 3:
            break
    header, messages = chunks[0], chunks[1:]
    set_byte("header-length", "the pjrt_ifrt header's length varint", 4, raw[4] ^ 0x01)
    for i, (start, end) in enumerate(messages):
        if end > start:
            set_byte(
                f"m{i}-first-tag",
                f"message {i}'s first tag made wire type 7",
                start,
                raw[start] | 0x07,
            )
    out.extend(_text_variants(raw, messages, recompressed))
    recompressed(
        "trailing-bytes", "four bytes added after the last message", raw + b"\x08\x01\x08\x01"
    )
    # away from message 0, the TPU program, whose bytes the chip would run
    spots = [*range(header[0], header[1]), *range(messages[1][0], len(raw))]
    for n in range(10):
        at = rng.choice(spots)
        set_byte(
            f"random-{n}",
            "a random byte outside the TPU program (message 0)",
            at,
            raw[at] ^ (1 + rng.randrange(255)),
        )
    return out


def _text_variants(
    raw: bytes, messages: list[tuple[int, int]], recompressed: Callable[[str, str, bytes], None]
) -> list[tuple[str, str, bytes]]:
    """One letter changed in texts no executable needs: a source path in the HLO metadata, the
    autotune folder in the compile options, a Mosaic kernel's debug location; and a byte that
    is not UTF-8 in the module's name."""
    found: list[tuple[str, str, int, int]] = []
    text = raw.decode("latin-1")
    path = text.find("capture_prog.py")
    if path > 0:
        found.append(
            (
                "debug-source-path",
                "one letter of the program's path in the HLO's source metadata",
                path,
                ord("K"),
            )
        )
    autotune = text.find("xla_gpu_per_fusion_autotune_cache_dir")
    if autotune < 0:
        autotune = text.find("tpucap/caches")
    if autotune > 0:
        found.append(
            (
                "debug-autotune-dir",
                "one letter of the autotune folder in the stored compile options",
                autotune + 3,
                ord("Q"),
            )
        )
    body = re.search(rb'"body":"([A-Za-z0-9+/=]+)"', raw)
    if body:
        import base64

        kernel = bytearray(base64.b64decode(body.group(1)))
        at = kernel.find(b"capture_prog.py")
        if at >= 0:
            kernel[at] = ord("K")
            encoded = base64.b64encode(bytes(kernel))
            data = raw[: body.start(1)] + encoded + raw[body.end(1) :]
            recompressed(
                "mosaic-debug-path",
                "one letter of the kernel's source path inside the first Mosaic body",
                data,
            )
    start, end = messages[1]
    for number, wt, a, _b in _fields(raw[start:end], start):
        if number == 20 and wt == 2:
            found.append(
                (
                    "module-name-not-utf8",
                    "the module name in the compiler metadata made not UTF-8",
                    a,
                    0xFF,
                )
            )
    for name, what, at, value in found:
        data = bytearray(raw)
        data[at] = value
        recompressed(name, f"{what} (payload byte {at})", bytes(data))
    return []


WORKER = """\
import json, os, sys, warnings
sys.path.insert(0, os.environ["CAPTURE_PROGRAM_DIR"])
import capture_prog as prog
import jax
from jax._src import compilation_cache
todo = json.load(open(os.environ["CAPTURE_TODO"]))
done = {json.loads(l)["name"] for l in open(os.environ["CAPTURE_RESULTS"])}
expected = {}
for item in todo:
    if item["name"] in done:
        continue
    target = item["target"]
    if target not in expected:  # the right answer, from the healthy entry
        open(item["path"], "wb").write(open(item["healthy"], "rb").read())
        jax.clear_caches(); compilation_cache.reset_cache()
        expected[target] = prog.run(target)[target]
    open(item["path"], "wb").write(open(item["variant"], "rb").read())
    jax.clear_caches(); compilation_cache.reset_cache()
    prog.OUTCOMES.clear()
    with open(os.environ["CAPTURE_RESULTS"], "a") as out:
        out.write(json.dumps({"name": item["name"], "started": True}) + "\\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = prog.run(target)[target]
    errors = [str(w.message) for w in caught if "persistent compilation cache" in str(w.message)]
    kinds = sorted({o[0] for o in prog.OUTCOMES if o[1] == item["module"]})
    if errors:
        verdict = "error"
    elif "hit" in kinds:
        verdict = "hit" if value == expected[target] else "hit-wrong-result"
    else:
        verdict = "miss"
    with open(os.environ["CAPTURE_RESULTS"], "a") as out:
        out.write(json.dumps({"name": item["name"], "verdict": verdict, "errors": errors,
                              "outcomes": prog.OUTCOMES, "value": value,
                              "expected": expected[target]}) + "\\n")
"""

DAMAGE_TARGETS = {"jit_add": "add", "jit_step": "step"}


def damage_step(python: Path) -> dict[str, object]:
    cache = WORK / "caches" / "damage"
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True)
    program = write_program("a", "", ADD_RHS)
    first = run_program(python, program, cache, WORK / "logs" / "damage-write.log", {})
    log(f"damage: wrote {summarise(first)}")
    todo = []
    vdir = WORK / "variants"
    shutil.rmtree(vdir, ignore_errors=True)
    for module, target in DAMAGE_TARGETS.items():
        (entry,) = cache.glob(f"{module}-*-cache")
        healthy = vdir / "healthy" / entry.name
        healthy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(entry, healthy)
        seed = int(hashlib.sha256(module.encode()).hexdigest()[:8], 16)
        for name, what, data in variants_of(entry.read_bytes(), seed):
            path = vdir / f"{module}.{name}" / entry.name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            todo.append(
                {
                    "name": f"{module}.{name}",
                    "what": what,
                    "target": target,
                    "module": module,
                    "path": str(entry),
                    "variant": str(path),
                    "healthy": str(healthy),
                }
            )
    todo_file, results = WORK / "damage-todo.json", WORK / "damage-results.jsonl"
    todo_file.write_text(json.dumps(todo))
    results.write_text("")
    env = dict(
        os.environ,
        JAX_COMPILATION_CACHE_DIR=str(cache),
        CAPTURE_PROGRAM_DIR=str(program.parent),
        CAPTURE_TODO=str(todo_file),
        CAPTURE_RESULTS=str(results),
    )
    for attempt in range(len(todo) + 1):
        done = subprocess.run(
            [str(python), "-c", WORKER], env=env, capture_output=True, text=True, timeout=400
        )
        lines = [json.loads(line) for line in results.read_text().splitlines() if line]
        finished = {r["name"] for r in lines if "verdict" in r}
        started = [r["name"] for r in lines if r.get("started")]
        if done.returncode == 0 and len(finished) == len(todo):
            break
        crashed = [n for n in started if n not in finished]
        log(f"damage worker ended rc {done.returncode} (attempt {attempt}): {done.stderr[-600:]}")
        with results.open("a") as out:
            for name in crashed:
                out.write(
                    json.dumps(
                        {"name": name, "verdict": "crashed", "errors": [done.stderr[-1500:]]}
                    )
                    + "\n"
                )
    for module in DAMAGE_TARGETS:  # the healthy entries back
        (entry,) = cache.glob(f"{module}-*-cache")
        shutil.copy(vdir / "healthy" / entry.name, entry)
    verdicts = {}
    for line in results.read_text().splitlines():
        r = json.loads(line)
        if "verdict" in r:
            verdicts[r["name"]] = r
    report = []
    for item in todo:
        r = verdicts.get(item["name"], {"verdict": "not run"})
        report.append(
            {
                "name": item["name"],
                "what": item["what"],
                "jax": r["verdict"],
                "errors": r.get("errors", []),
                "file": str(Path(item["variant"]).relative_to(WORK)),
            }
        )
        log(f"damage {item['name']}: JAX {r['verdict']} {str(r.get('errors', ''))[:160]}")
    return {"variants": report, "write": first}


# --- prune --corrupt on damaged entries, with JAX before and after ---------------------------

PRUNE_DAMAGE = (
    "cut-half",
    "zstd-rejects-1",
    "m1-first-tag",
    "trailing-bytes",
    "mosaic-debug-path",
    "debug-autotune-dir",
    "random-1",
    "random-2",
    "random-5",
)


def _add_entry_copies(python: Path, name: str) -> tuple[Path, Path, Path, Path, dict[str, bytes]]:
    """A cache the program wrote (``caches/<name>``), a pristine copy of it, the program, its
    ``jit_add`` entry and that entry's damaged copies by variant name."""
    cache = WORK / "caches" / name
    pristine = WORK / f"{name}-pristine"
    for folder in (cache, pristine):
        shutil.rmtree(folder, ignore_errors=True)
    cache.mkdir(parents=True)
    program = write_program("a", "", ADD_RHS)
    run_program(python, program, cache, WORK / "logs" / f"{name}-write.log", {})
    shutil.copytree(cache, pristine)
    (entry,) = cache.glob("jit_add-*-cache")
    seed = int(hashlib.sha256(b"jit_add").hexdigest()[:8], 16)
    variants = {v: data for v, _what, data in variants_of(entry.read_bytes(), seed)}
    return cache, pristine, program, entry, variants


def _add_verdict(found: dict[str, object]) -> str:
    """JAX's verdict on ``jit_add`` in one run: error (its load failed), hit or miss."""
    if any("jit_add" in e for e in found.get("errors") or []):  # type: ignore[union-attr]
        return "error"
    seen = [k for k, m, _ in found.get("outcomes") or [] if m == "jit_add"]  # type: ignore[misc]
    return seen[0] if seen else "?"


def prune_damage_step(python: Path) -> dict[str, object]:
    """Each of a few damaged copies of the jit_add entry in the cache JAX wrote it to: JAX run on
    it (its verdict), ``prune --corrupt --apply``, JAX run again. What prune removed, JAX had
    failed on (and now compiles and stores anew); what it kept, JAX loaded, or fails on still."""
    cache, pristine, program, entry, variants = _add_entry_copies(python, "prune-damage")
    out = []
    for name in PRUNE_DAMAGE:
        if name not in variants:
            continue
        _restore(pristine, cache)
        os.utime(cache, None)
        entry.write_bytes(variants[name])
        old = time.time() - 3600  # not a write in progress
        os.utime(entry, (old, old))
        before = run_program(python, program, cache, WORK / "logs" / "prune-damage.log", {})
        pruned = _cli(python, "prune", "--corrupt", "--apply", "--json", str(cache))
        removed = not entry.exists() or entry.read_bytes() != variants[name]
        after = run_program(python, program, cache, WORK / "logs" / "prune-damage.log", {})

        row = {
            "variant": name,
            "jax_before": _add_verdict(before),
            "pruned": removed,
            "jax_after": _add_verdict(after),
        }
        out.append({**row, "prune_rc": pruned["rc"]})
        log(f"prune-damage {name}: {row}")
    return {"variants": out}


# --- JAX's own failed loads, recorded, as the evidence of damage the reader does not see -------

LOAD_FAILURES = ("random-2", "zstd-silent-2", "zstd-silent-3", "mosaic-debug-path", "random-1")


def load_failures_step(python: Path) -> dict[str, object]:
    """Each of a few damaged copies of the jit_add entry, in the cache JAX wrote it to: JAX run
    with the stats recorder (``CACHEDOCTOR_HOOK=stats``: its verdict, and the record of it),
    ``scan --json`` (what it calls the entry now), ``prune --corrupt --apply``, and JAX twice
    again (a copy JAX refused compiles and is stored once, then hits; one it loaded hits)."""
    cache, pristine, program, entry, variants = _add_entry_copies(python, "load-failures")
    logs = WORK / "logs" / "load-failures.log"
    stats = {"CACHEDOCTOR_HOOK": "stats"}
    out = []
    for name in LOAD_FAILURES:
        if name not in variants:
            continue
        _restore(pristine, cache)
        entry.write_bytes(variants[name])
        old = time.time() - 3600
        os.utime(entry, (old, old))
        before = run_program(python, program, cache, logs, stats)
        scanned = _cli(python, "scan", "--json", str(cache), whole=True)
        try:
            findings = json.loads(scanned["stdout"])["findings"]  # type: ignore[arg-type]
        except ValueError:
            findings = [{"kind": "scan-unreadable", "evidence": scanned["stdout"][-300:]}]
        said = [
            f"{f['kind']}: {f['evidence'][:300]}"
            for f in findings
            if entry.name.removesuffix("-cache") in f.get("entries", [entry.name[:-6]])
        ]
        pruned = _cli(python, "prune", "--corrupt", "--apply", str(cache))
        removed = not entry.exists()
        after = run_program(python, program, cache, logs, stats)
        third = run_program(python, program, cache, logs, stats)

        row = {
            "variant": name,
            "jax_before": _add_verdict(before),
            "scan": said,
            "pruned": removed,
            "prune_rc": pruned["rc"],
            "jax_after": _add_verdict(after),
            "jax_third": _add_verdict(third),
        }
        out.append(row)
        log(f"load-failures {name}: {row}")
    return {"variants": out}


# --- cachedoctor's commands on the captured caches ----------------------------------------------


def _cli(
    python: Path, *args: str, env: dict[str, str] | None = None, whole: bool = False
) -> dict[str, object]:
    """One cachedoctor command: its exit status and the tails of what it printed (``whole``:
    all of its stdout, for a JSON document to parse)."""
    started = time.monotonic()
    done = subprocess.run(
        [str(python), "-m", "cachedoctor", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=300,
    )
    return {
        "args": list(args),
        "rc": done.returncode,
        "stdout": done.stdout if whole else done.stdout[-12000:],
        "stderr": done.stderr[-3000:],
        "seconds": round(time.monotonic() - started, 1),
    }


def _outcomes(found: dict[str, object]) -> dict[str, str]:
    """key -> "hit" | "miss", from a program run's own log of JAX's lookups."""
    return {key: kind for kind, _module, key in found.get("outcomes") or []}  # type: ignore[misc]


def _entries(cache: Path) -> set[str]:
    return {p.name[: -len("-cache")] for p in cache.glob("*-cache")}


def _restore(pristine: Path, cache: Path) -> None:
    shutil.rmtree(cache, ignore_errors=True)
    shutil.copytree(pristine, cache, symlinks=True)


PRUNE_SELECTORS = (
    ["--corrupt"],
    ["--duplicates"],
    ["--orphans"],
    ["--repair"],
    ["--relocated"],
    ["--stale-jax"],
    ["--max-size", "120KiB"],
    ["--older-than", "1s"],
    ["--module", "jit_add"],
    ["--module", "jit_*", "--corrupt"],
    ["--xla-subcaches"],
)


def commands_step(python: Path, save: Callable[[dict[str, object]], None]) -> dict[str, object]:
    """Every command on a TPU cache, and JAX as the oracle where a command predicts or removes:
    a cache written by runs with stats records (from folder a, from b, at another matmul
    precision); the reading commands on it; each prune selector applied to a fresh copy at the
    same path, then the program run again (what was removed must miss, the rest hit); rekey
    --relocated, then a stable run; pack and unpack to another folder, then a stable run
    against the prediction; check; status."""
    out: dict[str, object] = {}
    stats = {"CACHEDOCTOR_HOOK": "stats"}
    cache, pristine = WORK / "caches" / "cmd", WORK / "cmd-pristine"
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True)
    prog_a, prog_b = write_program("a", "", ADD_RHS), write_program("b", "", ADD_RHS)
    runs = {}
    for name, program, env in (
        ("a", prog_a, stats),
        ("b", prog_b, stats),
        ("a-highest", prog_a, {**stats, "CAPTURE_PRECISION": "highest"}),
    ):
        runs[name] = run_program(python, program, cache, WORK / "logs" / f"cmd-{name}.log", env)
        log(f"cmd {name}: {summarise(runs[name])}")
    out["runs"] = runs
    _restore(cache, pristine)
    add = sorted(p.name for p in cache.glob("jit_add-*-cache"))
    env = {"JAX_COMPILATION_CACHE_DIR": str(cache)}
    out["read"] = [
        _cli(python, *args, env=env)
        for args in (
            ["scan", str(cache)],
            ["scan", "--json", str(cache)],
            ["lint", str(cache)],
            ["stats", str(cache)],
            ["why", str(cache)],
            ["preflight", str(cache)],
            ["show", str(cache / add[0])],
            ["diff", str(cache / add[0]), str(cache / add[-1])],
            ["diff", "--module", "jit_add", "--dir", str(cache)],
            ["status"],
        )
    ]
    log("cmd: read commands done")
    save(out)
    # preflight's prediction for a run here, against JAX
    predicted = _cli(python, "preflight", "--json", str(cache), env=env)
    again = run_program(python, prog_a, cache, WORK / "logs" / "cmd-a-again.log", stats)
    out["preflight_then_run"] = {"preflight": predicted, "run": again}
    _restore(pristine, cache)
    out["prune"] = []
    for selector in PRUNE_SELECTORS:
        _restore(pristine, cache)
        before = _entries(cache)
        applied = _cli(python, "prune", *selector, "--apply", "--json", str(cache))
        removed = before - _entries(cache)
        found = run_program(python, prog_a, cache, WORK / "logs" / "cmd-after-prune.log", {})
        seen = _outcomes(found)
        wrong = sorted(
            k for k, kind in seen.items() if (kind == "hit") == (k in removed) and k in before
        )
        out["prune"].append(
            {
                "selector": selector,
                "prune": applied,
                "removed": sorted(removed),
                "jax": seen,
                "disagree": wrong,
                "results": found.get("results"),
            }
        )
        log(f"prune {' '.join(selector)}: removed {len(removed)}, JAX disagrees on {wrong}")
        save(out)
    _restore(pristine, cache)
    out["rekey"] = _rekey_scenario(python, prog_a)
    save(out)
    out["bundle"] = _bundle_scenario(python, prog_a)
    save(out)
    out["check"] = _cli(python, "check", "--runs", "2", "--", str(python), str(prog_a), env={})
    log(f"check: rc {out['check']['rc']}")  # type: ignore[index]
    save(out)
    return out


def _rekey_scenario(python: Path, program: Path) -> dict[str, object]:
    """Observe-mode entries copied to another folder (JAX misses them there: the autotune path
    is in the key), re-keyed with ``rekey --relocated``, then a stable run there."""
    obs, moved = WORK / "caches" / "obs", WORK / "caches" / "obs-moved"
    for folder in (obs, moved):
        shutil.rmtree(folder, ignore_errors=True)
    obs.mkdir(parents=True)
    wrote = run_program(
        python, program, obs, WORK / "logs" / "rekey-observe.log", {"CACHEDOCTOR_HOOK": "observe"}
    )
    shutil.copytree(obs, moved, symlinks=True)
    plan = _cli(python, "rekey", "--relocated", str(moved))
    applied = _cli(python, "rekey", "--relocated", "--apply", str(moved))
    run = run_program(
        python, program, moved, WORK / "logs" / "rekey-stable.log", {"CACHEDOCTOR_HOOK": "stable"}
    )
    log(f"rekey: {summarise(run)}")
    return {"observe": wrote, "plan": plan, "apply": applied, "stable_run": run}


def _bundle_scenario(python: Path, program: Path) -> dict[str, object]:
    """The stable-keyed cache packed, unpacked into another folder with the prediction, then a
    stable run there: what unpack said will hit, against JAX."""
    source = WORK / "caches" / "moved-stable"
    bundle, target = WORK / "bundle.tar", WORK / "caches" / "unpacked"
    bundle.unlink(missing_ok=True)
    shutil.rmtree(target, ignore_errors=True)
    stable = {"CACHEDOCTOR_HOOK": "stable", "JAX_COMPILATION_CACHE_DIR": str(target)}
    packed = _cli(python, "pack", str(source), "-o", str(bundle))
    plan = _cli(python, "unpack", "--json", str(bundle), str(target), env=stable)
    applied = _cli(python, "unpack", "--apply", str(bundle), str(target), env=stable)
    run = run_program(
        python,
        program,
        target,
        WORK / "logs" / "unpacked-stable.log",
        {"CACHEDOCTOR_HOOK": "stable"},
    )
    log(f"bundle: {summarise(run)}")
    return {"pack": packed, "unpack_plan": plan, "unpack": applied, "stable_run": run}


def _save(target: Path, found: dict[str, object]) -> None:
    target.write_text(json.dumps(found, indent=1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--wheels", type=Path, help="cachedoctor's dependencies as wheels")
    parser.add_argument("--steps", default=",".join(STEPS))
    args = parser.parse_args()
    steps = [s for s in args.steps.split(",") if s]
    unknown = sorted(set(steps) - set(STEPS))
    if unknown:
        parser.error(f"unknown steps {unknown}; known: {', '.join(STEPS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    (WORK / "programs").mkdir(parents=True, exist_ok=True)
    python = make_env(args.wheels)
    if Path(sys.prefix) != WORK / "venv":  # on in the environment: its zstandard, its cachedoctor
        os.execv(str(python), [str(python), __file__, *sys.argv[1:]])
    results: dict[str, object] = {
        "environment": environment(python),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    log(f"environment: {results['environment']}")
    for step in steps:
        started = time.monotonic()
        try:
            if step == "moved":
                results[step] = moved_step(python, "moved", {})
            elif step == "moved-stable":
                results[step] = moved_step(python, "moved-stable", {"CACHEDOCTOR_HOOK": "stable"})
            elif step == "damage":
                results[step] = damage_step(python)
            elif step == "prune-damage":
                results[step] = prune_damage_step(python)
            elif step == "load-failures":
                results[step] = load_failures_step(python)
            elif step == "commands":
                commands_step(python, functools.partial(_save, args.out / "commands.json"))
        except Exception as exc:  # keep what the other steps found
            import traceback

            results[step] = {"error": traceback.format_exc()}
            log(f"{step} failed: {exc!r}")
        log(f"{step}: {time.monotonic() - started:.0f} s")
        (args.out / "results.json").write_text(json.dumps(results, indent=1))
    with tarfile.open(args.out / "capture.tar.gz", "w:gz") as tar:
        for part in ("caches", "programs", "logs", "variants"):
            if (WORK / part).exists():
                tar.add(WORK / part, arcname=part)
    log(f"wrote {sorted(p.name for p in args.out.iterdir())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
