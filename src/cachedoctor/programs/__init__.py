"""Small JAX programs that cachedoctor runs in subprocesses (demo, check, tests).

They are plain scripts: each reads its settings from the environment, so they behave the same
under every supported JAX version.
"""

from pathlib import Path

PROGRAMS_DIR = Path(__file__).parent


def program_path(name: str) -> Path:
    """Path of a bundled program script, e.g. ``program_path("seed")``."""
    return PROGRAMS_DIR / f"{name}.py"
