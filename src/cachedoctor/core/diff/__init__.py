"""Why two cache entries are two entries: load, compare section by section, decide a verdict."""
