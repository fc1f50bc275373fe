"""Build: what a user writes. Graphs and their tasks, access marks, kernels, futures,
tiled matrices with their placement and memory, and graph fingerprints.

Imports only :mod:`taskgraph.core`.
"""
