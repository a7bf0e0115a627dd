"""The CLI as users run it."""
