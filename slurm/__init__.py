"""SLURM job templates and a JupyterHub example, installed as ``taskgraph.slurm``.

The files here are data (see README.md); ``taskgraph.batch.sbatch`` fills the templates.
"""
