"""The Slurm inventory source: ``[slurm] enabled = true`` and ``inventory = true``."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from backend.config import Config, Node


class SlurmInventory:
    """Slurm's nodes (one ``sinfo``, or slurmrestd with ``[slurm] url``): see
    :mod:`backend.slurm.inventory`."""

    name = "slurm"

    def enabled(self, config: Config) -> bool:
        from backend.slurm.settings import SlurmSettings

        st = config.section(SlurmSettings)
        return st.enabled and st.inventory

    async def nodes(self, config: Config) -> list[Node]:
        from backend.slurm.client import SlurmClient
        from backend.slurm.inventory import nodes_from_slurm
        from backend.slurm.settings import SlurmSettings

        found, _skipped = await SlurmClient(config.section(SlurmSettings)).nodes()
        return nodes_from_slurm(found, config)
