"""Renderers: each turns a core report (plain dataclasses) into one output format.

The core never prints; commands pick a format by name from ``render.formats`` (one interface,
one registry), and each format calls the per-report functions of the modules beside it.
"""
