"""What the tests share that is not a fixture: cache builders, program runners, byte vectors."""
