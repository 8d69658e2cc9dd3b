"""Extras built on the public API: the race fixture and the pytest plugin."""
