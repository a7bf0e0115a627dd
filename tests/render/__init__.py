"""The renderer registry and each format's output."""
