"""The scan and its memo."""
