"""`r1cloud eval`: sampling a model or checkpoint over a data set in its own process (run) and the
scores it reports (metrics)."""
