"""diff's verdicts and their evidence."""
