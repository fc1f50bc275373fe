"""Shared leaves every layer may use: errors, settings, the machine's CPUs, files.

Nothing here imports another part of taskgraph.
"""
