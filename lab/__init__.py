"""The sandbox lab: real OpenSSH sshd nodes on 127.0.0.x and a real SeaweedFS S3 on loopback.

Used by the test suite (tests/conftest.py) and by ``loadmaster lab up``/``down``: the same real
parts an operator meets, started on one machine. Nothing here is a mock; only ``nvidia-smi`` is a
stand-in script (these machines have no GPU).
"""

from lab.fleet import Lab, LabNodeOptions
from lab.postgres import PrivateCluster
from lab.seaweed import SeaweedS3
from lab.sshd import SshdNode

__all__ = ["Lab", "LabNodeOptions", "PrivateCluster", "SeaweedS3", "SshdNode"]
