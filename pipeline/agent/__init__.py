"""The agent under test: resolving the release's agent package (npm, Python wheel) and checking it."""
