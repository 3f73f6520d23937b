"""Judgement thresholds that the loader acts on and ``autoloader status`` reports by: one
owner, so the two never disagree. Imports nothing of the project."""

# The share of an epoch's loop spent waiting for data above which adaptation looks for a
# faster loader (``DataLoader(adapt_threshold=...)``'s default), and above which
# ``autoloader status`` names a rank as waiting.
WAIT_THRESHOLD = 0.05
# How far the measured peak may exceed the memory model's prediction before the loader
# warns that the plan is stale and ``autoloader status`` says so.
DRIFT_LIMIT = 0.10
