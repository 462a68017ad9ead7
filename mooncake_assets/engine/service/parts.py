"""What the parts of a :class:`~.service.ReplicatorService` see of it: one set of role Protocols.

The service is composed of parts; the table registry (``registry.py``) is handed its config,
catalog and lock, the others (``replication.py``, ``persist.py``, ``provision.py``, ``verifier.py``)
keep a back-reference to the service. Each part is typed with the
role below that names exactly the service attributes it uses, so a part's file reads on its own and
mypy checks that :class:`~.service.ReplicatorService` (which hands ``self`` to those parts) has them:

================================  ===========================================================  =====================
role                              attributes                                                   used by
================================  ===========================================================  =====================
:class:`SharedState`              ``reg`` (TableRegistry), ``lock`` (the service lock,         the other ``*Host``s
                                  an EpochLock), ``config`` (ServiceConfig)
:class:`SchedulerHost`            SharedState + ``stream`` (:class:`StopsTables`)               ``PersistScheduler``
:class:`SourceState`              SharedState + ``source_catalog`` (SourceCatalog)              the two below
:class:`StreamHost`               SourceState + ``persister`` (:class:`Ticks`), ``generated``   ``StreamLoop``
:class:`ProvisionerHost`          SourceState + ``catalog`` (Iceberg), ``stream``               ``TableProvisioner``
                                  (:class:`StreamControl`)
:class:`VerifierHost`             the service's public face: ``lock``, ``dsn``, ``tables``,     ``Verifier``
                                  ``registry``, ``record_verify``, ``wait_lsn``, ``read_state``
:class:`DiscoveryHost`            SharedState + ``dsn``, ``create_table``                       ``TableDiscovery``
================================  ===========================================================  =====================

The part-to-part roles (:class:`StopsTables`, :class:`Ticks`, :class:`StreamControl`) are Protocols
rather than the concrete classes so this module imports none of the parts (no import cycle between
``service`` modules; ``pyproject.toml`` ``[tool.importlinter]``, the ``acyclic_siblings`` contract).
Nothing here runs: the Protocols are never checked with ``isinstance``.
"""

from __future__ import annotations

from typing import Any, Protocol

from pyiceberg.catalog import Catalog

from ..cdc.generated import GeneratedColumns
from ..pg.catalog import SourceCatalog
from ..table.mirror import MirrorTable
from ..table.read_state import ReadState
from .board import EpochLock
from .config import ServiceConfig
from .memory import MemoryBudget
from .registry import TableRegistry

__all__ = [
    "ProvisionerHost",
    "SchedulerHost",
    "SharedState",
    "SourceState",
    "StopsTables",
    "StreamControl",
    "StreamHost",
    "Ticks",
    "VerifierHost",
]


class SharedState(Protocol):
    """What every part shares: the table registry, the service lock (every change of table state
    holds it) and the service's configuration."""

    @property
    def reg(self) -> TableRegistry: ...
    @property
    def lock(self) -> EpochLock: ...
    @property
    def config(self) -> ServiceConfig: ...


class StopsTables(Protocol):
    """The stream loop as the persist scheduler sees it: it stops one table at an LSN with an error
    (the caller holds the lock; :meth:`~.replication.StreamLoop.stop_table`), and ``applied_lsn``: every
    commit below it is applied (a consistent cut is taken there, ``cut.py``)."""

    applied_lsn: int

    def stop_table(self, t: MirrorTable, e: Exception, lsn: int) -> None: ...


class Ticks(Protocol):
    """The persist scheduler as the stream loop sees it: ticked twice a second from the stream thread
    (:meth:`~.persist.PersistScheduler.tick`); a failed flush of the memory budget's goes to
    ``maintenance_failed``."""

    def tick(self) -> None: ...

    def maintenance_failed(self, t: MirrorTable, e: Exception) -> None: ...


class StreamControl(Protocol):
    """The stream loop as the provisioner sees it: ``applied_lsn`` (int: every commit below it is
    applied), ``pub_seen`` (table -> LSN it was last seen published), the slot and thread controls."""

    applied_lsn: int
    pub_seen: dict[str, int]

    def ensure_slot(self) -> None: ...
    def ensure_stream(self) -> None: ...
    def halt(self) -> None: ...


class SchedulerHost(SharedState, Protocol):
    """What :class:`~.persist.PersistScheduler` uses of the service."""

    @property
    def stream(self) -> StopsTables: ...


class SourceState(SharedState, Protocol):
    """SharedState plus the source catalog (``engine/pg/catalog.py``: the catalog reads that schema
    changes and new mirrors are checked against)."""

    @property
    def source_catalog(self) -> SourceCatalog: ...


class StreamHost(SourceState, Protocol):
    """What :class:`~.replication.StreamLoop` uses of the service: the persist scheduler to tick, the
    STORED generated columns to fill (``engine/cdc/generated.py``), the source catalog and the memory
    budget (``memory.py``)."""

    @property
    def persister(self) -> Ticks: ...
    @property
    def generated(self) -> GeneratedColumns: ...
    @property
    def memory(self) -> MemoryBudget: ...


class ProvisionerHost(SourceState, Protocol):
    """What :class:`~.provision.TableProvisioner` uses of the service: the Iceberg catalog new
    mirrors are created in, the stream loop and the source catalog."""

    @property
    def catalog(self) -> Catalog: ...
    @property
    def stream(self) -> StreamControl: ...


class VerifierHost(Protocol):
    """What :class:`~.verifier.Verifier` uses of the service: its public control surface (the verifier
    reads mirrors the way a client would, through ``read_state`` and ``wait_lsn``)."""

    @property
    def lock(self) -> EpochLock: ...
    @property
    def dsn(self) -> str: ...
    @property
    def tables(self) -> dict[str, MirrorTable]: ...
    @property
    def registry(self) -> dict[str, Any]: ...

    def record_verify(self, name: str, res: dict[str, Any]) -> None: ...

    def wait_lsn(self, lsn: int, timeout_s: float = 30.0) -> int: ...

    def read_state(self, name: str, lsn: int | None = None) -> ReadState: ...


class DiscoveryHost(SharedState, Protocol):
    """What :class:`~.discovery.TableDiscovery` uses: the registry and lock (which source tables a
    mirror follows), the source DSN (its catalog look) and create-table (the one way a mirror is made)."""

    @property
    def dsn(self) -> str: ...

    def create_table(
        self,
        dst: str,
        src: str,
        delete_format: str = "deletion-vectors",
        column_types: dict[str, str] | None = None,
        exclude: list[str] | None = None,
        **kw: Any,
    ) -> dict[str, Any]: ...
