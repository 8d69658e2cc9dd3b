"""The jobs wing: the job table (models, states, queries), enqueue, handlers and the engine.

Builds on :mod:`tombstones.records`; the admin and the commands build on it.
"""
