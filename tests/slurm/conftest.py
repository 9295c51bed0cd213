"""The Slurm tests' fixtures (tests/slurm_fixtures.py): the real slurmctld and slurmd on loopback."""

from tests.slurm_fixtures import slurm, slurm_lab

__all__ = ["slurm", "slurm_lab"]
