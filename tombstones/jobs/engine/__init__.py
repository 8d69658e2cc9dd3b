"""The engine: the pump that claims, checks, acts and records, and the threads beside it."""
