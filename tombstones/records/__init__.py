"""The records wing: the mixin, its querysets, lifecycle writes and the handler's fences.

Imports nothing from the jobs or the admin: they build on it.
"""
