"""Cost of the stable key per compile and of a warm start, against JAX alone.

1. Per compile: for each program (plain; seed, one custom_partitioning op; multi, four ops in one
   module) a first process with the hook records the cache; a second captures the arguments of
   every ``get_cache_key`` call and times, per module, JAX's own ``get_cache_key``, the base key
   (``keys.stable_key``) and the hook's whole path on that warm cache, which for a module with
   custom_partitioning calls is the replay of its recorded partitioner calls (medians).
2. Warm start: whole-process wall time of ``plain`` on a warm cache, with the hook and without,
   in alternating runs (ratio of medians, and of minimums).
3. Warm start of many modules, as a user starts it: a fresh interpreter jits ``--modules``
   distinct small functions (``bench_stats``'s program), every one a cache hit, with the hook
   activated at start-up (``CACHEDOCTOR_HOOK=stable``: the ``.pth`` line, the hook's imports,
   stats recording) and without (no activation), ``--pairs`` alternating pairs. Wall and CPU time
   (user + system) of the whole process: the median of the per-pair ratios, with their
   quartiles and extremes (the spread). With ``--store s3`` the cache is a prefix in a bucket
   on moto's S3 server on 127.0.0.1 (started here: its CPU is not the children's): the hook
   then lists the manifests once per process and writes its stats record there too.

    python benchmarks/bench_hook.py [--repeat 50] [--starts 10] [--python PATH]
    python benchmarks/bench_hook.py --many-only [--modules 100] [--pairs 15] [--store s3]
    python benchmarks/bench_hook.py --phases RUNS [--modules 120]   # where a hooked start goes
    python benchmarks/bench_hook.py --share RUNS [--modules 120]    # the hook's own CPU in it
    ... --many-only --mode stats|off   # the recorder alone against JAX alone; off: an A/A run
    ... --many-only --cpus 0           # every timed process on these CPUs (less spread)

4. ``--phases``: the same start, with the process's CPU taken at the end of each phase (the
   interpreter's start, ``import jax`` with the activation, the loop, the exit handlers with the
   stats record, the teardown after them), hook on and off, medians of RUNS processes each.

Within a pair the side that starts first alternates (off first, then on first): a process
started right after another runs on caches that one left. ``--cpus`` pins every timed
process (both sides) to those CPUs: XLA's thread pools then cannot spin on an idle core, which
is most of the spread of a process's CPU time on a 2-core machine (a ratio's denominator is
then smaller too, which makes the hook's share larger, not smaller).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench_stats import PROGRAM as MANY_MODULES

from cachedoctor.layout import CACHE_SUFFIX

ROOT = Path(__file__).resolve().parents[1]

_CHILD = r"""
import json, os, runpy, statistics, sys, time
repeat, prog = int(sys.argv[1]), sys.argv[2]
from jax._src import compilation_cache as cc
from cachedoctor.stablekeys import hook, keys, splithash
hook.install("stable")
captured = []
wrapped = cc.get_cache_key
original = splithash.jax_get_cache_key()
def capture(*args, **kwargs):
    captured.append((args, kwargs))
    return wrapped(*args, **kwargs)
capture.__cachedoctor_original__ = original  # else the hook falls back to JAX's key
cc.get_cache_key = capture
sys.argv = [prog]
runpy.run_path(prog, run_name="__main__")
cc.get_cache_key = wrapped

def median_ms(fn):
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3

rows = []
for args, kwargs in captured:
    jax_ms = median_ms(lambda: original(*args, **kwargs))
    stable_ms = median_ms(lambda: keys.stable_key(*args[:4]))
    hook_ms = median_ms(lambda: wrapped(*args, **kwargs))
    name = keys.stable_key(*args[:4]).module_name
    rows.append({"module": name, "jax_ms": jax_ms, "stable_ms": stable_ms, "hook_ms": hook_ms})
print("BENCH " + json.dumps({"rows": rows, "stats": hook.stats()}))
"""

# four custom_partitioning ops in one module (the seed's op, with different shard functions)
MULTI = """
import os, sys
sys.path.insert(0, {programs!r})
from _common import setup_jax
jax = setup_jax()
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

def make(k):
    @custom_partitioning
    def op(x):
        return x
    def partition(mesh, arg_shapes, result_shape):
        s = NamedSharding(mesh, P("x"))
        return mesh, lambda x: jnp.sin(x) * k + k, s, (s,)
    def infer(mesh, arg_shapes, result_shape):
        return NamedSharding(mesh, P("x"))
    op.def_partition(
        partition=partition, infer_sharding_from_operands=infer, sharding_rule="i -> i"
    )
    return op

ops = [make(float(k)) for k in range(4)]
def f(x):
    for op in ops:
        x = op(x)
    return x
mesh = Mesh(jax.devices(), ("x",))
s = NamedSharding(mesh, P("x"))
x = jax.device_put(jnp.arange(8, dtype=jnp.float32), s)
print("result:", [float(v) for v in jax.jit(f, in_shardings=s, out_shardings=s)(x)])
"""

# a program run with or without the hook (argv: mode program)
_START = r"""
import runpy, sys
if sys.argv[1] == "stable":
    from cachedoctor.stablekeys import hook
    hook.install("stable")
sys.argv = [sys.argv[2]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


PROGRAMS = ROOT / "src" / "cachedoctor" / "programs"


def _env(cache: str) -> dict[str, str]:
    """As a user runs it: bytecode caches on (compiling cachedoctor's sources on every start
    would be measured otherwise)."""
    return {
        **{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
        "JAX_PLATFORMS": "cpu",
        "JAX_COMPILATION_CACHE_DIR": cache,
        "PYTHONPATH": str(ROOT / "src"),
        "CACHEDOCTOR_DISABLE": "1",
    }


def _program(name: str, folder: str) -> Path:
    if name != "multi":
        return PROGRAMS / f"{name}.py"
    path = Path(folder) / "multi.py"
    path.write_text(MULTI.format(programs=str(PROGRAMS)))
    return path


def run(program: str, repeat: int, python: str) -> list[dict[str, float]]:
    with tempfile.TemporaryDirectory() as cache:
        prog = _program(program, cache)
        env = _env(cache)
        subprocess.run(
            [python, "-c", _START, "stable", str(prog)], env=env, check=True, capture_output=True
        )
        out = subprocess.run(
            [python, "-c", _CHILD, str(repeat), str(prog)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
    line = next(x for x in out.stdout.splitlines() if x.startswith("BENCH "))
    data = json.loads(line[6:])
    if data["stats"]["replayed"] == 0 and program != "plain":
        raise SystemExit(f"{program}: the warm run did not replay: {data['stats']}")
    rows: list[dict[str, float]] = data["rows"]
    return rows


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def warm_start(program: str, starts: int, python: str) -> dict[str, float]:
    """Wall and CPU time of whole processes on a warm cache, hook and JAX alone alternating.

    CPU time (user + system of the child) is what to compare on a shared machine: wall time
    there also measures the neighbours.
    """
    times: dict[str, list[float]] = {"none": [], "stable": []}
    cpu: dict[str, list[float]] = {"none": [], "stable": []}
    with tempfile.TemporaryDirectory() as cache:
        prog = str(_program(program, cache))
        env = _env(cache)
        for mode in times:  # warm the cache for both key schemes
            subprocess.run(
                [python, "-c", _START, mode, prog], env=env, check=True, capture_output=True
            )
        for _ in range(starts):
            for mode in times:
                t0, c0 = time.perf_counter(), _child_cpu()
                subprocess.run(
                    [python, "-c", _START, mode, prog], env=env, check=True, capture_output=True
                )
                times[mode].append(time.perf_counter() - t0)
                cpu[mode].append(_child_cpu() - c0)
    jax_alone, hook = times["none"], times["stable"]
    return {
        "jax_s": statistics.median(jax_alone),
        "hook_s": statistics.median(hook),
        "median_ratio": statistics.median(hook) / statistics.median(jax_alone),
        "min_ratio": min(hook) / min(jax_alone),
        "jax_cpu_s": statistics.median(cpu["none"]),
        "hook_cpu_s": statistics.median(cpu["stable"]),
        "cpu_ratio": statistics.median(cpu["stable"]) / statistics.median(cpu["none"]),
    }


def _user_env(cache: str, hook: str | None) -> dict[str, str]:
    """A user's environment: no config file; ``CACHEDOCTOR_HOOK`` set or not."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CACHEDOCTOR_", "JAX_"))}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env |= {"JAX_PLATFORMS": "cpu", "JAX_COMPILATION_CACHE_DIR": cache}
    env["PYTHONPATH"] = str(ROOT / "src")
    env["CACHEDOCTOR_CONFIG"] = os.path.join(tempfile.gettempdir(), "no-cachedoctor-config.toml")
    if hook is not None:
        env["CACHEDOCTOR_HOOK"] = hook
    return env


def _entries(cache: str) -> int:
    if "://" in cache:
        from cachedoctor.storage import stores

        return sum(1 for i in stores.open_store(cache).list() if i.name.endswith(CACHE_SUFFIX))
    return sum(1 for p in Path(cache).iterdir() if p.name.endswith(CACHE_SUFFIX))


@contextlib.contextmanager
def _caches(store: str) -> Iterator[dict[str, str]]:
    """One cache per mode (the hook's keys are not JAX's): two local folders, or two prefixes
    in a bucket on moto's S3 server (``bench_bucket``'s, on 127.0.0.1)."""
    if store == "local":
        with tempfile.TemporaryDirectory() as folder:
            yield {"off": f"{folder}/off", "stable": f"{folder}/stable"}
        return
    from bench_bucket import _s3_server

    with _s3_server() as (url, _upload):
        yield {"off": f"{url}/many-off", "stable": f"{url}/many-hook"}


def _spread(ratios: list[float]) -> dict[str, float]:
    q1, median, q3 = statistics.quantiles(ratios, n=4)
    return {"median": median, "q1": q1, "q3": q3, "min": min(ratios), "max": max(ratios)}


def warm_start_many(
    modules: int,
    pairs: int,
    python: str,
    store: str = "local",
    mode: str = "stable",
    cpus: set[int] | None = None,
) -> dict[str, Any]:
    """Whole processes jitting ``modules`` functions on a warm cache, hook on and off alternating.

    ``mode``: the ``CACHEDOCTOR_HOOK`` of the "on" side (``stats``: the recorder alone;
    ``off``: JAX alone on both sides, an A/A run that shows what the pair order alone does).
    Every compile must be a hit: a miss writes an entry (the program caches every compile), so
    the number of entries is checked unchanged after the timed runs.
    """
    runs: dict[str, list[tuple[float, float]]] = {"off": [], "stable": []}
    hooks = {"off": None, "stable": None if mode == "off" else mode}
    with _caches(store) as caches:

        def start(side: str) -> tuple[float, float]:
            t0, c0 = time.perf_counter(), _child_cpu()
            subprocess.run(
                [python, "-c", MANY_MODULES, str(modules)],
                env=_user_env(caches[side], hooks[side]),
                check=True,
                capture_output=True,
                preexec_fn=_pinned(cpus),
            )
            return time.perf_counter() - t0, _child_cpu() - c0

        for side in runs:  # warm the cache for both key schemes (JAX's keys, stable keys)
            start(side)
        entries = {side: _entries(cache) for side, cache in caches.items()}
        for pair in range(pairs):
            for side in list(runs)[:: 1 if pair % 2 == 0 else -1]:  # who starts first alternates
                runs[side].append(start(side))
        if {side: _entries(cache) for side, cache in caches.items()} != entries:
            raise SystemExit("a timed run missed the cache (it wrote an entry): not a warm start")
    result: dict[str, Any] = {
        "modules": modules,
        "pairs": pairs,
        "store": store,
        "mode": mode,
        "cpus": sorted(cpus) if cpus else None,
    }
    for i, what in enumerate(("wall", "cpu")):
        off = [r[i] for r in runs["off"]]
        on = [r[i] for r in runs["stable"]]
        result[what] = {
            "off_median_s": statistics.median(off),
            "hook_median_s": statistics.median(on),
            "ratio_of_medians": statistics.median(on) / statistics.median(off),
            "pair_ratios": _spread([b / a for a, b in zip(off, on, strict=True)]),
            "off_spread": max(off) / min(off),
        }
    return result


# The hook's own CPU time inside one process started as a user starts it (CACHEDOCTOR_HOOK=stable):
# start-up activation (timed by wrapping the function the .pth watcher calls right after
# ``import jax``), and per lookup what the hook's key function costs beyond JAX's own key
# (both timed again on the captured arguments afterwards, alternating, minimum per call), plus
# what the first lookup cost beyond its later best (what the hook imports on first use).
_SHARE = r"""
import json, sys, time
from cachedoctor.stablekeys import _startup
pt = time.process_time
activation = []
real_activate = _startup.activate
def timed_activate():
    start = pt()
    try:
        return real_activate()
    finally:
        activation.append(pt() - start)
_startup.activate = timed_activate
from jax._src import compilation_cache as cc
hooked = cc.get_cache_key
original = getattr(hooked, "__cachedoctor_original__", hooked)  # JAX's own when not hooked
captured, live = [], []
def capture(*args, **kwargs):
    captured.append((args, kwargs))
    start = pt()
    try:
        return hooked(*args, **kwargs)
    finally:
        live.append(pt() - start)
# the hook finds JAX's own function through this attribute: without it, the hook takes the
# wrapper for JAX's and falls back to JAX's key on every lookup (counted below, refused)
capture.__cachedoctor_original__ = original
cc.get_cache_key = capture
program, sys.argv = sys.argv[1], sys.argv[1:]
exec(compile(program, "<program>", "exec"), {"__name__": "__main__"})
process_cpu = pt()
cc.get_cache_key = hooked
best = {"jax": [float("inf")] * len(captured), "hook": [float("inf")] * len(captured)}
for _ in range(20):
    for i, (args, kwargs) in enumerate(captured):
        for name, fn in (("jax", original), ("hook", hooked)):
            start = time.perf_counter()
            fn(*args, **kwargs)
            best[name][i] = min(best[name][i], time.perf_counter() - start)
from cachedoctor.stablekeys import hook
print("SHARE " + json.dumps({
    "activation_s": sum(activation), "lookups": len(captured), "jax_keys_s": sum(best["jax"]),
    "hook_keys_s": sum(best["hook"]), "process_cpu_s": process_cpu,
    "first_lookup_extra_s": live[0] - best["hook"][0], "live_hook_keys_s": sum(live),
    "fallbacks": hook.stats()["fallbacks"],
}))
"""


def _pinned(cpus: set[int] | None) -> Any:
    """What a timed child runs before the program: its CPUs set to ``cpus`` (None: all)."""
    if not cpus:
        return None
    return lambda: os.sched_setaffinity(0, cpus)


def _run_many(
    harness: str, modules: int, cache: str, mode: str, python: str, cpus: set[int] | None = None
) -> subprocess.CompletedProcess[str]:
    """The many-module program under ``harness`` (a script given the program's text and
    argv), as a user starts it: ``mode`` "off" without activation, else that hook mode."""
    return subprocess.run(
        [python, "-c", harness, MANY_MODULES, str(modules)],
        env=_user_env(cache, None if mode == "off" else mode),
        check=True,
        capture_output=True,
        text=True,
        preexec_fn=_pinned(cpus),
    )


def hook_share(modules: int, runs: int, python: str) -> dict[str, float]:
    """The hook's own CPU in a hooked warm start (medians of ``runs`` processes): activation,
    and its keys beyond JAX's, both as replayed (each lookup's arguments 20 times, the best:
    warm caches) and live (the program's own lookups, hooked processes against processes
    without the hook, alternating: the cost a start pays, JAX's own work between lookups
    having evicted what the replays find in the caches)."""
    rows: dict[str, list[dict[str, float]]] = {"stable": [], "off": []}
    with _caches("local") as caches:
        for i in range(runs + 1):  # the first round warms both caches
            for mode in rows:
                out = _run_many(_SHARE, modules, caches[mode], mode, python)
                if i:
                    line = next(x for x in out.stdout.splitlines() if x.startswith("SHARE "))
                    rows[mode].append(json.loads(line[6:]))
    if any(r["fallbacks"] for r in rows["stable"]):
        raise SystemExit("the hook fell back to JAX's key: not a measure of its own")
    med = {k: statistics.median(r[k] for r in rows["stable"]) for k in rows["stable"][0]}
    live_jax = statistics.median(r["live_hook_keys_s"] for r in rows["off"])
    extra = med["hook_keys_s"] - med["jax_keys_s"]
    live_extra = med["live_hook_keys_s"] - live_jax
    hook = med["activation_s"] + med["first_lookup_extra_s"] + extra
    live_hook = med["activation_s"] + live_extra
    return {
        **med,
        "keys_extra_s": extra,
        "share": hook / (med["process_cpu_s"] - hook),
        "live_jax_keys_s": live_jax,
        "live_keys_extra_s": live_extra,
        "live_share": live_hook / (med["process_cpu_s"] - live_hook),
    }


# The many-module program with its process's CPU taken at the end of each phase: the
# interpreter's start (site and .pth lines), ``import jax`` (the hook's activation runs inside
# it), the program's loop, and the exit handlers (the stats record); the teardown after them is
# the rest of the process's CPU, which the parent reads from ``wait4``.
_PHASES = r"""
import atexit, sys, time
pt = time.process_time
marks = {"start": pt()}
def _last():
    marks["exit"] = pt()
    print("PHASES", marks["start"], marks["jax"] - marks["start"], marks["loop"] - marks["jax"],
          marks["exit"] - marks["loop"], file=sys.stderr)
atexit.register(_last)  # registered first: runs after every other exit handler
import jax
marks["jax"] = pt()
program, sys.argv = sys.argv[1], sys.argv[1:]
exec(compile(program, "<program>", "exec"), {"__name__": "__main__"})
marks["loop"] = pt()
"""
PHASE_NAMES = ("start", "import jax", "loop", "exit handlers", "teardown")


def phases(
    modules: int, runs: int, python: str, mode: str = "stable", cpus: set[int] | None = None
) -> dict[str, dict[str, float]]:
    """Medians of each phase's CPU, hook on (``mode``) and off, ``runs`` alternating processes
    each."""
    found: dict[str, list[list[float]]] = {"off": [], "stable": []}
    with _caches("local") as caches:
        for i in range(runs + 1):  # the first round warms both caches
            for side in list(found)[:: 1 if i % 2 == 0 else -1]:
                c0 = _child_cpu()
                hook = "off" if side == "off" else mode
                out = _run_many(_PHASES, modules, caches[side], hook, python, cpus)
                total = _child_cpu() - c0
                line = next(x for x in out.stderr.splitlines() if x.startswith("PHASES "))
                parts = [float(x) for x in line.split()[1:]]
                if i:
                    found[side].append([*parts, total - sum(parts)])
    return {
        side: {
            name: statistics.median(col)
            for name, col in zip(PHASE_NAMES, zip(*rows, strict=True), strict=True)
        }
        for side, rows in found.items()
    }


def _print_phases(result: dict[str, dict[str, float]]) -> None:
    off, on = result["off"], result["stable"]
    total_off = sum(off.values())
    print("phase            off ms  hook ms    +ms  (medians; the process's CPU)")
    for name in PHASE_NAMES:
        print(
            f"{name:<15} {off[name] * 1e3:7.1f} {on[name] * 1e3:8.1f} "
            f"{(on[name] - off[name]) * 1e3:6.1f}"
        )
    extra = sum(on.values()) - total_off
    print(
        f"{'all':<15} {total_off * 1e3:7.1f} {sum(on.values()) * 1e3:8.1f} {extra * 1e3:6.1f}"
        f"  ({extra / total_off:+.1%})"
    )
    print("BENCH-PHASES " + json.dumps(result))


def _print_many(result: dict[str, Any]) -> None:
    print(
        f"warm start, {result['modules']} modules, all hits, {result['pairs']} alternating pairs, "
        f"cache {'in an S3 bucket (moto)' if result['store'] == 's3' else 'local'} "
        f"(on: CACHEDOCTOR_HOOK={result.get('mode', 'stable')}; off: no activation)"
        + (f", pinned to CPUs {result['cpus']}" if result.get("cpus") else "")
    )
    for what in ("wall", "cpu"):
        r = result[what]
        p = r["pair_ratios"]
        print(
            f"  {what:<4} off {r['off_median_s']:.3f} s, on {r['hook_median_s']:.3f} s (medians): "
            f"on/off {r['ratio_of_medians']:.3f}; per pair median {p['median']:.3f}, "
            f"quartiles {p['q1']:.3f}-{p['q3']:.3f}, range {p['min']:.3f}-{p['max']:.3f}; "
            f"off's own max/min {r['off_spread']:.3f}"
        )
    print("BENCH-MANY " + json.dumps(result))


def _print_share(share: dict[str, float]) -> None:
    print(
        f"hook's own CPU in a hooked start of {share['lookups']:.0f} lookups (medians): "
        f"activation {share['activation_s'] * 1e3:.1f} ms, first lookup +"
        f"{share['first_lookup_extra_s'] * 1e3:.1f} ms, keys {share['hook_keys_s'] * 1e3:.1f}"
        f" ms against JAX's {share['jax_keys_s'] * 1e3:.1f} ms (+{share['keys_extra_s'] * 1e3:.1f}"
        f" ms); process {share['process_cpu_s']:.2f} s CPU: the hook adds {share['share']:.2%}"
    )
    print(
        f"  live, the program's own lookups: keys {share['live_hook_keys_s'] * 1e3:.1f} ms"
        f" against {share['live_jax_keys_s'] * 1e3:.1f} ms in processes without the hook"
        f" (+{share['live_keys_extra_s'] * 1e3:.1f} ms); with the activation, the hook adds"
        f" {share['live_share']:.2%}"
    )
    print("BENCH-SHARE " + json.dumps(share))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--starts", type=int, default=10)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--modules", type=int, default=100)
    parser.add_argument("--pairs", type=int, default=15)
    parser.add_argument("--many-only", action="store_true", help="only the many-module start")
    parser.add_argument(
        "--phases",
        type=int,
        metavar="RUNS",
        help="only the many-module start, phase by phase, RUNS processes each side",
    )
    parser.add_argument(
        "--mode",
        choices=("stable", "observe", "stats", "off"),
        default="stable",
        help="the CACHEDOCTOR_HOOK of the 'on' side of --many-only and --phases (off: A/A)",
    )
    parser.add_argument(
        "--share",
        type=int,
        metavar="RUNS",
        help="only the hook's own CPU in a hooked start (activation, keys live and replayed)",
    )
    parser.add_argument(
        "--store", choices=("local", "s3"), default="local", help="where the many-module cache is"
    )
    parser.add_argument(
        "--cpus",
        type=lambda text: {int(c) for c in text.split(",")},
        help="pin the timed processes of --many-only and --phases to these CPUs (e.g. 0)",
    )
    args = parser.parse_args()
    if args.phases:
        _print_phases(phases(args.modules, args.phases, args.python, args.mode, args.cpus))
        return
    if args.share:
        _print_share(hook_share(args.modules, args.share, args.python))
        return
    if args.many_only:
        _print_many(
            warm_start_many(args.modules, args.pairs, args.python, args.store, args.mode, args.cpus)
        )
        if args.store == "local" and args.mode == "stable":
            _print_share(hook_share(args.modules, 5, args.python))
        return
    print(
        f"{'program':<8} {'module':<18} {'jax ms':>8} {'stable ms':>10} {'hook ms':>8} "
        f"{'stable/jax':>10} {'hook/jax':>9}"
    )
    for program in ("plain", "seed", "multi"):
        for row in run(program, args.repeat, args.python):
            print(
                f"{program:<8} {row['module']:<18} {row['jax_ms']:8.3f} "
                f"{row['stable_ms']:10.3f} {row['hook_ms']:8.3f} "
                f"{row['stable_ms'] / row['jax_ms']:10.2f} {row['hook_ms'] / row['jax_ms']:9.2f}"
            )
    for program in ("plain", "seed"):
        w = warm_start(program, args.starts, args.python)
        print(
            f"warm start {program}: JAX alone {w['jax_s']:.2f} s, hook {w['hook_s']:.2f} s "
            f"(medians of {args.starts} alternating runs): hook/jax {w['median_ratio']:.3f} "
            f"(minimums: {w['min_ratio']:.3f}); CPU time JAX alone {w['jax_cpu_s']:.2f} s, "
            f"hook {w['hook_cpu_s']:.2f} s: hook/jax {w['cpu_ratio']:.3f}"
        )
    _print_many(warm_start_many(args.modules, args.pairs, args.python))
    _print_share(hook_share(args.modules, 5, args.python))


if __name__ == "__main__":
    main()
