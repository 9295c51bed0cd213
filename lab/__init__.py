"""The sandbox lab: real OpenSSH sshd nodes on 127.0.0.x and a real SeaweedFS S3 on loopback.

Used by the test suite (tests/conftest.py) and by ``loadmaster lab up``/``down``: the same real
parts an operator meets, started on one machine. Nothing here is a mock; only ``nvidia-smi`` is a
stand-in script (these machines have no GPU).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from backend.ops.exports import lazy_exports

if TYPE_CHECKING:
    from lab.fleet import Lab, LabNodeOptions
    from lab.postgres import PrivateCluster
    from lab.seaweed import SeaweedS3
    from lab.sshd import SshdNode

__all__ = ["Lab", "LabNodeOptions", "PrivateCluster", "SeaweedS3", "SshdNode"]
if not TYPE_CHECKING:  # each name loads on first use: a light module of the lab (``lab.process``,
    # ``lab.seed``) does not bring the whole lab and the SSH stack with it (``loadmaster --help``)
    __getattr__ = lazy_exports(
        __name__,
        {
            **dict.fromkeys(("Lab", "LabNodeOptions"), "lab.fleet"),
            "PrivateCluster": "lab.postgres",
            "SeaweedS3": "lab.seaweed",
            "SshdNode": "lab.sshd",
        },
    )
