"""``stats --format openmetrics`` and ``--format prometheus``: the metric families of
``core/metrics.py`` as text a scraper reads.

OpenMetrics 1.0 (``application/openmetrics-text``): ``# TYPE`` names a counter without its
``_total``, ``# UNIT`` where there is one, ``# EOF`` last. The Prometheus text format 0.0.4 is
what node_exporter's textfile collector parses (``expfmt.TextParser``): it reads ``# UNIT`` and
``# EOF`` as comments, and gives ``# HELP`` and ``# TYPE`` only to samples of the very name
they name, so a counter's lines name ``..._total``, as prometheus_client's 0.0.4 output does.
"""

from __future__ import annotations

import math

from cachedoctor.core.metrics import MetricFamily, Sample, StatsMetrics

_LABEL_ESCAPES = str.maketrans({"\\": "\\\\", '"': '\\"', "\n": "\\n"})
_HELP_ESCAPES = str.maketrans({"\\": "\\\\", "\n": "\\n"})


def openmetrics_text(metrics: StatsMetrics) -> str:
    lines = []
    for family in metrics.families:
        lines.append(f"# HELP {family.name} {family.help.translate(_HELP_ESCAPES)}")
        lines.append(f"# TYPE {family.name} {family.type}")
        if family.unit:
            lines.append(f"# UNIT {family.name} {family.unit}")
        lines.extend(map(_sample_line, family.samples))
    return "\n".join([*lines, "# EOF"]) + "\n"


def prometheus_text(metrics: StatsMetrics) -> str:
    lines = []
    for family in metrics.families:
        name = _exposed_name(family)
        lines.append(f"# HELP {name} {family.help.translate(_HELP_ESCAPES)}")
        lines.append(f"# TYPE {name} {family.type}")
        lines.extend(map(_sample_line, family.samples))
    return "\n".join(lines) + "\n"


def _exposed_name(family: MetricFamily) -> str:
    """The name 0.0.4's ``# HELP`` and ``# TYPE`` give: the samples' own."""
    return family.name + "_total" if family.type == "counter" else family.name


def _sample_line(sample: Sample) -> str:
    labels = ",".join(f'{k}="{_label_value(v)}"' for k, v in sample.labels)
    return f"{sample.name}{{{labels}}} {_number(sample.value)}"


def _label_value(value: str) -> str:
    """Escaped as both formats escape it, in UTF-8 both read: a lone surrogate (a name no
    encoder writes) becomes U+FFFD."""
    if any("\ud800" <= ch <= "\udfff" for ch in value):
        value = "".join("\ufffd" if "\ud800" <= ch <= "\udfff" else ch for ch in value)
    return value.translate(_LABEL_ESCAPES)


def _number(value: float) -> str:
    """An int as one, a float as Python's shortest repr (both formats read ``1e-05``)."""
    if isinstance(value, int):
        return str(value)
    if math.isfinite(value):
        return repr(value)
    return "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")
