"""Batch: notebooks to scripts (:mod:`~taskgraph.batch.convert`, and the shims the
scripts call, :mod:`~taskgraph.batch.nbshim`), SLURM jobs
(:mod:`~taskgraph.batch.sbatch`), the demo and the ``taskgraph`` command.
"""
