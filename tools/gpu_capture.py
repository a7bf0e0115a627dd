#!/usr/bin/env python3
"""Capture real GPU cache entries and XLA sub-cache files for cachedoctor's tests (issue 15).

Run once on a GPU machine, from the repository root, with the Python that has jax[cuda]. The
device image has click and rich but no zstandard, which cachedoctor's reader imports: carry a
cp312 manylinux wheel of it in ``.whl/`` (see the device README) and start with

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl \
      && export PYTHONPATH=/tmp/site; \
    PYTHONUNBUFFERED=1 python3 tools/gpu_capture.py --out "$OUT" 2>&1 | tee "$OUT/capture.log"

(Without zstandard, JAX writes zlib entries and this script's own decoding still works; only the
``cachedoctor`` CLI runs in step 3 would fail.)

It (1) compiles four small programs twice each, in fresh processes, with the persistent cache,
the per-fusion autotune cache and the kernel cache on (``jax_persistent_cache_enable_xla_caches
= all``): a plain jit, a sharded bf16 matmul, a custom_partitioning op, and GEMM fusions plus a
convolution that the autotuner has to tune; (2) decodes every entry and both sub-caches with
cachedoctor's own decoders (gpu, riegeli, splitproto, subcaches) and writes ``decode.json``;
(3) runs ``cachedoctor scan --json`` and ``show`` (whatever this checkout has); (4) packs a few
MB of entries and sub-cache files into ``capture.tar.gz``. At most 8 files land in --out, as the
device tool returns no more. Nothing here needs network access; zstandard is optional (without
it JAX writes zlib entries, and we read both).

Without a GPU, ``JAX_PLATFORMS=cpu python tools/gpu_capture.py --out /tmp/capture`` runs every
step in about 90 s (the CPU entries then fail the GPU decoding, so it exits 1): a check that the
script still runs after the package moves. ``tests/e2e/test_gpu_capture.py`` runs step 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import io
import json
import os
import platform
import subprocess
import sys
import tarfile
import time
import traceback
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

PROGRAMS = ("plain", "sharded_matmul", "custom_partitioning", "gemm_fusions")
MAX_TAR_ENTRY_BYTES = 10 << 20
MAX_KERNEL_CACHE_COPY = 4 << 20


# --- the programs (run in child processes: python3 gpu_capture.py --program NAME) ------------


def run_program(name: str, cache_dir: str) -> None:
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    jax.config.update("jax_compilation_cache_dir", cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    jax.config.update("jax_persistent_cache_enable_xla_caches", "all")
    print(f"[{name}] jax {jax.__version__}, devices {jax.devices()}", flush=True)
    mesh = Mesh(jax.devices(), ("x",))
    key = jax.random.PRNGKey(0)

    if name == "plain":
        out = jax.jit(lambda x: jnp.sin(x) * 2 + 1)(jnp.arange(4096, dtype=jnp.float32))
    elif name == "sharded_matmul":
        a = jax.random.normal(key, (2048, 1024), jnp.bfloat16)
        b = jax.random.normal(key, (1024, 1024), jnp.bfloat16)
        a = jax.device_put(a, NamedSharding(mesh, P("x", None)))
        out = jax.jit(lambda a, b: a @ b, out_shardings=NamedSharding(mesh, P("x", None)))(a, b)
    elif name == "custom_partitioning":
        from jax.experimental.custom_partitioning import custom_partitioning

        def part(mesh, arg_shapes, result_shape):
            spec = NamedSharding(mesh, P("x"))
            return mesh, lambda x: x + 1.0, spec, (spec,)

        @custom_partitioning
        def op(x):
            return x

        kwargs = {
            "infer_sharding_from_operands": lambda mesh, a, r: NamedSharding(mesh, P("x")),
            "partition": part,
        }
        try:
            op.def_partition(sharding_rule="i -> i", **kwargs)
        except TypeError:
            op.def_partition(**kwargs)
        spec = NamedSharding(mesh, P("x"))
        x = jax.device_put(jnp.arange(1024, dtype=jnp.float32), spec)
        out = jax.jit(op, in_shardings=spec, out_shardings=spec)(x)
    elif name == "gemm_fusions":
        a = jax.random.normal(key, (2048, 1536), jnp.bfloat16)
        b = jax.random.normal(key, (1536, 768), jnp.float32)
        c = jax.random.normal(key, (768,), jnp.bfloat16)
        img = jax.random.normal(key, (8, 64, 64, 32), jnp.bfloat16)
        ker = jax.random.normal(key, (3, 3, 32, 64), jnp.bfloat16)

        def f(a, b, c, img, ker):
            y = jnp.dot(jax.nn.gelu(a), b.astype(jnp.bfloat16)) + c  # a Triton GEMM fusion
            z = jnp.dot(y.T, jnp.tanh(y))  # another dot, different shape
            conv = jax.lax.conv_general_dilated(
                img, ker, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
            )
            return z.sum() + conv.astype(jnp.float32).sum()

        out = jax.jit(f)(a, b, c, img, ker)
    else:
        raise SystemExit(f"unknown program {name}")
    jax.block_until_ready(out)
    print(f"[{name}] done", flush=True)


# --- decoding with cachedoctor's modules -----------------------------------------------------


def _jsonable(value: object) -> object:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, bytes | bytearray | memoryview):
        data = bytes(value)
        return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()[:16]}
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, Path):
        return str(value)
    return value


def _decompress(raw: bytes) -> tuple[str, bytes]:
    if raw[:4] == b"\x28\xb5\x2f\xfd":
        import zstandard

        return "zstd", zstandard.ZstdDecompressor().decompress(raw, max_output_size=1 << 31)
    return "zlib", zlib.decompress(raw)


def _split_ifrt_header(payload: bytes) -> tuple[bytes | None, bytes]:
    """jax >= 0.9.1: varint length + SerializedXlaExecutableMetadata, then the PjRt payload."""
    from cachedoctor.formats.wire import WireError, fields_by_number, read_varint

    try:
        n, pos = read_varint(payload, 0, len(payload))
        header = payload[pos : pos + n]
        fields = fields_by_number(header)
        runtime = fields.get(2, [b""])[-1]
        if isinstance(runtime, memoryview) and bytes(runtime) == b"pjrt_ifrt":
            return header, payload[pos + n :]
    except WireError:
        pass
    return None, payload


def decode_entry(path: Path) -> dict[str, object]:
    from cachedoctor.formats import riegeli
    from cachedoctor.xla import gpu

    out: dict[str, object] = {"file": path.name, "size": path.stat().st_size}
    try:
        t0 = time.perf_counter()
        compression, raw = _decompress(path.read_bytes())
        out["compression"] = compression
        out["compile_seconds"] = int.from_bytes(raw[:4], "big")
        header, pjrt = _split_ifrt_header(raw[4:])
        out["ifrt_header_bytes"] = None if header is None else len(header)
        out["pjrt_first_bytes"] = pjrt[:16].hex()
        out["pjrt_is_riegeli"] = gpu.is_riegeli_payload(pjrt)
        if riegeli.is_riegeli(pjrt):
            out["pjrt_chunks"] = _jsonable(riegeli.read_records(pjrt).chunks)
        entry = gpu.decode_gpu_pjrt_payload(pjrt)
        out["client_name"] = entry.client_name
        out["executable"] = _jsonable(entry.executable)
        out["payload_problems"] = list(entry.payload.problems)
        from cachedoctor.formats.wire import fields_by_number

        exe = bytes(fields_by_number(entry.payload.executable_and_options)[1][-1])
        out["executable_first_bytes"] = exe[:16].hex()
        if riegeli.is_riegeli(exe):
            out["executable_chunks"] = _jsonable(riegeli.read_records(exe).chunks)
        out["decode_seconds"] = round(time.perf_counter() - t0, 3)
        if entry.executable.hlo_module is not None:
            try:
                from jax._src.lib import xla_client

                text = xla_client.XlaComputation(entry.executable.hlo_module).as_hlo_text()
                out["hlo_text_head"] = text.splitlines()[:3]
            except Exception as exc:  # report, do not stop the capture
                out["hlo_text_error"] = repr(exc)
    except Exception:
        out["error"] = traceback.format_exc()
    return out


def decode_all(cache: Path) -> dict[str, object]:
    from cachedoctor.layout import AUTOTUNE_DIR, KERNEL_CACHE_FILE
    from cachedoctor.xla import subcaches

    entries = [decode_entry(path) for path in sorted(cache.glob("*-cache"))]
    result: dict[str, object] = {"entries": entries}
    t0 = time.perf_counter()
    autotune = subcaches.scan_autotune_dir(cache / AUTOTUNE_DIR)
    result["autotune"] = _jsonable(autotune)
    result["autotune_seconds"] = round(time.perf_counter() - t0, 3)
    # Check the name rule against the first file's content is impossible (the key is hashed),
    # so keep a few raw files verbatim for the fixtures instead.
    result["autotune_samples"] = {
        e.name: (cache / AUTOTUNE_DIR / e.name).read_text(errors="replace")[:2000]
        for e in autotune.entries[:6]
    }
    kc = cache / KERNEL_CACHE_FILE
    result["kernel_cache"] = _jsonable(subcaches.read_kernel_cache(kc)) if kc.exists() else None
    result["listing"] = sorted(
        f"{p.relative_to(cache)} {p.stat().st_size}" for p in cache.rglob("*") if p.is_file()
    )
    return result


# --- orchestration ---------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu-capture-out"))
    parser.add_argument("--work", default="/tmp/cachedoctor-gpu-capture")
    parser.add_argument("--program", help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.program:
        run_program(args.program, args.cache)
        return 0

    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    cache = work / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, JAX_EXPLAIN_CACHE_MISSES="1", JAX_LOG_COMPILES="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))

    lines = [f"python {sys.version}", f"platform {platform.platform()}"]
    for cmd in (
        ["nvidia-smi", "--query-gpu=name,driver_version,compute_cap", "--format=csv"],
        [sys.executable, "-m", "pip", "list", "--format=freeze"],
    ):
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            text = res.stdout
            if "pip" in cmd:
                keep = ("jax", "jaxlib", "jax-cuda", "zstandard", "click", "rich", "nvidia-cu")
                text = "\n".join(x for x in text.splitlines() if x.lower().startswith(keep))
            lines.append(text)
        except (OSError, subprocess.SubprocessError) as exc:
            lines.append(f"{cmd[0]}: {exc}")

    log = io.StringIO()
    before: set[str] = set()
    for name in PROGRAMS:
        for attempt in (1, 2):
            t0 = time.perf_counter()
            cmd = [sys.executable, __file__, "--program", name, "--cache", str(cache)]
            res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
            now = {p.name for p in cache.glob("*-cache")}
            log.write(
                f"=== {name} run {attempt}: rc={res.returncode} "
                f"{time.perf_counter() - t0:.1f}s new entries={sorted(now - before)}\n"
            )
            log.write(res.stdout[-4000:] + res.stderr[-12000:] + "\n")
            print(f"{name} run {attempt}: rc={res.returncode}, {len(now - before)} new", flush=True)
            before = now
    (out / "programs.log").write_text(log.getvalue())

    decoded = decode_all(cache)
    decoded["environment"] = lines
    (out / "decode.json").write_text(json.dumps(decoded, indent=1, default=repr))
    decoded_entries = decoded["entries"]
    assert isinstance(decoded_entries, list)
    errors = [e["file"] for e in decoded_entries if "error" in e]
    print(f"decoded {len(decoded_entries)} entries, {len(errors)} with errors", flush=True)

    cli = io.StringIO()
    runs = [["scan", "--json", str(cache)], ["scan", str(cache)]]
    entries = sorted(cache.glob("*-cache"), key=lambda p: p.stat().st_size)
    for p in entries[:3]:
        runs += [["show", str(p)], ["show", "--json", "--hlo", str(p)]]
    for argv in runs:
        res = subprocess.run(
            [sys.executable, "-m", "cachedoctor", *argv],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        cli.write(
            f"$ cachedoctor {' '.join(argv)}\nrc={res.returncode}\n{res.stdout[-20000:]}\n"
            f"--- stderr\n{res.stderr[-4000:]}\n"
        )
    (out / "cli.txt").write_text(cli.getvalue())

    # A few MB of real files for fixtures: the smallest entry of each program, every autotune
    # file and tmp/ leftover, the kernel cache if small.
    picked: list[Path] = []
    seen: set[str] = set()
    for p in entries:
        module = p.name.rsplit("-", 2)[0]
        if module not in seen and p.stat().st_size <= MAX_TAR_ENTRY_BYTES:
            seen.add(module)
            picked.append(p)
    from cachedoctor.layout import AUTOTUNE_DIR, KERNEL_CACHE_FILE

    picked += sorted(p for p in (cache / AUTOTUNE_DIR).rglob("*") if p.is_file())
    kc = cache / KERNEL_CACHE_FILE
    if kc.exists() and kc.stat().st_size <= MAX_KERNEL_CACHE_COPY:
        picked.append(kc)
    tar_path = out / "capture.tar.gz"
    with tarfile.open(tar_path, "w:gz") as tar:
        for p in picked:
            tar.add(p, arcname=str(p.relative_to(cache)))
    readme = (
        "Made by tools/gpu_capture.py on a GPU machine.\n" + "\n".join(lines) + "\n"
        f"cache dir was {cache}\nfiles: {[str(p.relative_to(cache)) for p in picked]}\n"
        f"sha256 of capture.tar.gz: {hashlib.sha256(tar_path.read_bytes()).hexdigest()}\n"
    )
    (out / "README-capture.txt").write_text(readme)
    print(readme, flush=True)
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
