"""The core of each command, one package per job: what a cache holds (scan), why two entries
differ (diff), what to remove (prune, rekey), whether keys are stable (check), how the cache is
used (usage, stats), CI gates (lint). Each returns plain frozen dataclasses; none prints or
parses options.
"""
