"""schema: the profile (params/*.yaml) and the one pydantic schema behind it: every key a profile or a
notebook's parameters cell may hold, with its type, choices, default and help (params); and what
each notebook's results.json and a run's index.json hold, one model each (results)."""
