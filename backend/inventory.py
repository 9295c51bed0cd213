"""Where the node list comes from: the config's own ``[[nodes]]``, or an inventory source.

An :class:`InventorySource` turns something outside the config (Slurm's node table today; a cloud
API tomorrow) into ``backend.config.Node`` entries when the config is loaded; everything
downstream takes a ``Config`` and never knows the source. A source takes the connection details
(user, port, key, jump host) from ``[defaults]``, and a ``[[nodes]]`` entry of the same name
overrides them for that node.

Sources, one line each in :data:`SOURCES`:

| source | enabled by | nodes |
| :- | :- | :- |
| ``slurm`` | ``[slurm] enabled = true`` and ``inventory = true`` | every node of ``sinfo`` (``partitions`` only), at Slurm's ``NodeAddr`` |

A source that cannot be read stops the load with one line naming it: a console on a guessed
inventory would act on the wrong nodes.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from backend.errors import ConfigError, LoadmasterError

if TYPE_CHECKING:
    from backend.config import Config, Node

_T = TypeVar("_T")


@runtime_checkable
class InventorySource(Protocol):
    """Nodes from outside the config."""

    #: The source's name in messages (``slurm``).
    name: str

    def enabled(self, config: Config) -> bool:
        """Whether the config asks for this source."""
        ...

    async def nodes(self, config: Config) -> list[Node]:
        """The nodes, connection details from ``[defaults]`` and per-node overrides."""
        ...


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


#: Every inventory source; the first enabled one supplies the nodes.
SOURCES: tuple[Callable[[], InventorySource], ...] = (SlurmInventory,)


def _run(fn: Callable[[], Coroutine[Any, Any, _T]]) -> _T:
    """Run a source's coroutine to its end from synchronous code, inside a running loop or not."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(fn())
    with ThreadPoolExecutor(1, thread_name_prefix="inventory") as pool:
        return pool.submit(lambda: asyncio.run(fn())).result()


def resolve(config: Config) -> Config:
    """``config`` with its nodes from the enabled source (unchanged when none is enabled)."""
    for make in SOURCES:
        source = make()
        if not source.enabled(config):
            continue
        try:
            nodes = _run(partial(source.nodes, config))
        except LoadmasterError as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ConfigError(
                f"cannot read the node inventory from {source.name}: {first}", file=config.source, key=source.name
            ) from None
        if not nodes:
            raise ConfigError(
                f"the {source.name} inventory has no nodes (check its partitions)", file=config.source, key=source.name
            )
        return dataclasses.replace(config, nodes=tuple(nodes))
    return config
