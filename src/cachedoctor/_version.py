"""The package version: one place, read by the build (hatch) and by every module that names it."""

__version__ = "0.1.0"
