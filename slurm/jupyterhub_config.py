# An HPC JupyterHub whose notebook servers run as SLURM jobs (batchspawner), ready for
# taskgraph. An example to adapt, not a drop-in file: partitions, accounts, module
# names and paths are site-specific.
#
#   pip install jupyterhub batchspawner wrapspawner
#   jupyterhub -f jupyterhub_config.py
#
# Each user picks a profile in the spawn form. Their notebook server runs inside a
# SLURM allocation, and in the notebook
#
#   cluster = tg.Cluster(n=4)      # engines under srun inside that allocation
#
# (one node: Cluster(n) starts its controller on 127.0.0.1, so its engines must run on
# the notebook's node; the "node" profile below asks for exactly that)
# or, for engines bigger than the notebook's own allocation, a separate job of
# engines (`taskgraph sbatch --engines --nodes 4 ... -o engines.sh; sbatch engines.sh`)
# and `tg.Cluster.attach(connection_file=...)` with the file its output names.

c = get_config()  # noqa: F821 - provided by JupyterHub when it loads this file

c.JupyterHub.spawner_class = "wrapspawner.ProfilesSpawner"
c.Spawner.http_timeout = 300  # a queued job may take a while to start
c.Spawner.start_timeout = 600
c.JupyterHub.hub_ip = "0.0.0.0"  # compute nodes must reach the hub

# What every notebook job runs first: the site's MPI and Python, taskgraph's
# thread settings (one worker per core of the job, BLAS threads to match), and traces
# in the user's scratch directory.
_prologue = """
module load python/3.11 openmpi/4.1
source $HOME/venvs/taskgraph/bin/activate
export TASKGRAPH_WORKERS=${SLURM_CPUS_PER_TASK:-1}
export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}
export OPENBLAS_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}
export MKL_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}
export NUMBA_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}
export TASKGRAPH_MPIEXEC=srun   # Cluster(n=...) starts its engines with the job's srun
export TASKGRAPH_TRACE_DIR=${SCRATCH:-$HOME}/taskgraph-traces
"""

c.SlurmSpawner.batch_script = (
    """#!/bin/bash
#SBATCH --job-name=jupyterhub
#SBATCH --output={{homedir}}/jupyterhub-%j.log
#SBATCH --chdir={{homedir}}
#SBATCH --export={{keepvars}}
#SBATCH --get-user-env=L
{% if partition %}#SBATCH --partition={{partition}}
{% endif %}{% if runtime %}#SBATCH --time={{runtime}}
{% endif %}{% if nprocs %}#SBATCH --cpus-per-task={{nprocs}}
{% endif %}{% if options %}#SBATCH {{options}}
{% endif %}
set -euo pipefail
trap 'echo SIGTERM received' TERM
"""
    + _prologue
    + """
{{prologue}}
which jupyterhub-singleuser
{{cmd}}
echo "jupyterhub-singleuser ended gracefully"
{{epilogue}}
"""
)

# (display name, key, spawner, settings): one line per kind of notebook job.
c.ProfilesSpawner.profiles = [
    (
        "Notebook only: 1 node share, 4 cores, 2 hours",
        "small",
        "batchspawner.SlurmSpawner",
        dict(req_partition="interactive", req_nprocs="4", req_runtime="2:00:00"),
    ),
    (
        "Notebook + 4 MPI ranks x 8 cores on 1 node, 4 hours",
        "node",
        "batchspawner.SlurmSpawner",
        dict(
            req_partition="compute",
            req_nprocs="8",
            req_runtime="4:00:00",
            req_options="--nodes=1 --ntasks-per-node=4",
        ),
    ),
]
