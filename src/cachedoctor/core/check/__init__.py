"""`check -- CMD`: run a command again and again against one cache; unstable keys, stale hits."""
