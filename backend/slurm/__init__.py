"""Slurm as a source of node state and jobs: what it says about each node (state and flags, the
reason with who set it and when, partitions, GRES) and each job (user, name, elapsed time, the GPU
indices it holds on each node).

``SlurmClient`` runs Slurm's commands (one ``sinfo`` and one ``squeue`` per read), ``parse`` turns
their output into the frozen snapshots of ``model`` with one adapter per JSON shape, and
``settings`` is the ``[slurm]`` config section. Changes (drain, resume) are operations:
:mod:`backend.ops.slurm`.
"""

from backend.slurm.model import Gres, NodeState, SlurmJob, SlurmNode, SlurmSnapshot

__all__ = ["Gres", "NodeState", "SlurmJob", "SlurmNode", "SlurmSnapshot"]
