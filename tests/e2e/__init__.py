"""Whole workflows as a user runs them: the console script, the Action, the API, real programs."""
