"""Where the fleet comes from: inventory sources, asked in order when the config is loaded.

1. The config's own ``[[nodes]]`` tables (:class:`~backend.inventory.tables.ConfigNodes`), each
   naming its hosts through one table source (:data:`~backend.inventory.tables.TABLE_SOURCES`),
   picked by the key the table sets; ``backend.config.parse_config`` asks them, so a bad table is
   reported with the file's other problems:

   | key | source | hosts |
   | :- | :- | :- |
   | ``name`` | ``names.HostlistNames`` | a name or hostlist (``gpu-[01-16]``) |
   | ``hostfile`` | ``hostfile.HostfileInventory`` | a DeepSpeed/MPI hostfile, with slots |
   | ``ssh_config`` | ``ssh_config.SshConfigInventory`` | ``~/.ssh/config`` Host aliases matching a glob |

2. Then an :class:`InventorySource`, one line each in :data:`SOURCES`, turns something outside the
   config (Slurm's node table today; a cloud API tomorrow) into ``backend.config.Node`` entries
   (``backend.config.load_config_file`` hands the parsed config to :func:`resolve`); the first
   enabled one replaces the tables' fleet. It takes the connection details (user, port, key, jump
   host) from ``[defaults]``, and a ``[[nodes]]`` entry of the same name overrides them for that
   node:

   | source | enabled by | nodes |
   | :- | :- | :- |
   | ``slurm`` | ``[slurm] enabled = true`` and ``inventory = true`` | every node of ``sinfo`` (``partitions`` only), at Slurm's ``NodeAddr`` |

Everything downstream takes a ``Config`` and never knows the source. The node types themselves
are in :mod:`backend.inventory.model` (re-exported by ``backend.config``), below both.

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
from backend.inventory.slurm import SlurmInventory

if TYPE_CHECKING:
    from backend.config import Config
    from backend.inventory.model import Node

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
