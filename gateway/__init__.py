"""ZEPS gateway: reliable multicast pub-sub for Python.

A gateway sequences and journals every published record and multicasts record batches (PGM, NORM or UDP); a
replay sidecar serves the journal over TCP; the client merges both connections into one gap-free, in-order,
exactly-once stream. This module is the public API: what is imported from here is what we keep stable.

    from gateway import Publisher, Subscriber

    with Publisher("tcp://127.0.0.1:5570", "px") as pub:
        pub.publish("eu.bund", b"101.25")
    with Subscriber("px", replay="tcp://127.0.0.1:5571", start="earliest") as sub:
        rec = sub.next(timeout=1.0)

The layers below (`gateway.wire`, `gateway.transport`, `gateway.journal`, `gateway.sequencer`,
`gateway.replication`, `gateway.sidecar`, `gateway.client`, ...) are importable too, for tools and tests;
docs/architecture.md draws them.
"""

import importlib
import os
from typing import TYPE_CHECKING

from gateway.errors import (
    AuthError,
    BadRecord,
    BadRecordType,
    BatchError,
    BufferFull,
    Closed,
    ConfigError,
    DataLoss,
    DiscoveryError,
    JournalCorrupt,
    JournalError,
    JournalLocked,
    JournalTrimmed,
    McastError,
    NotAJournal,
    NotGranted,
    ProtocolError,
    PublishError,
    ReplayError,
    ReplayRefused,
    SlowConsumer,
    Unauthenticated,
    ZepsError,
)

# OpenPGM's clock (its rate limiter and every timer) is gettimeofday() in Debian's build unless PGM_TIMER says
# otherwise, and it stands still while the wall clock is behind its last reading: a wall clock stepped back
# froze a PGM sender for as long as the step (docs/pgm.md, "Clock"). CLOCK_GETTIME is CLOCK_MONOTONIC. OpenPGM
# reads it once, at the process's first pgm_init, which libzmq makes when its first context is created: so here,
# before any gateway code makes one. A PGM_TIMER the environment sets is kept.
os.environ.setdefault("PGM_TIMER", "CLOCK_GETTIME")

if TYPE_CHECKING:
    from gateway.client.async_publisher import AsyncPublisher
    from gateway.client.async_subscriber import AsyncSubscriber
    from gateway.client.directory import Directory, Holder, LanDirectory, StreamInfo
    from gateway.client.etcd_directory import EtcdDirectory
    from gateway.client.file_directory import FileDirectory
    from gateway.client.publisher import Publisher
    from gateway.client.replay_client import ReplayClient, history, snapshot
    from gateway.client.subscriber import Checkpoint, Delivery, Received, Subscriber, SubscriberStats
    from gateway.mcast import Endpoint, Tuning
    from gateway.reconcile import Start, State
    from gateway.transport.curve import CurveClientKeys, CurveServerKeys
    from gateway.transport.pgm import PgmSettings
    from gateway.wire.streamkey import StreamKey

# The rest of the public API is imported on first use (PEP 562): `import gateway`, which every `zeps` command and
# every library module does first, then costs the errors alone, not the whole client library, etcd's client and
# every multicast transport (docs/mirroring.md, "Promotion": a command's start is most of its time).
_LAZY = {
    "gateway.client.async_publisher": ("AsyncPublisher",),
    "gateway.client.async_subscriber": ("AsyncSubscriber",),
    "gateway.client.directory": ("Directory", "Holder", "LanDirectory", "StreamInfo"),
    "gateway.client.etcd_directory": ("EtcdDirectory",),
    "gateway.client.file_directory": ("FileDirectory",),
    "gateway.client.publisher": ("Publisher",),
    "gateway.client.replay_client": ("ReplayClient", "history", "snapshot"),
    "gateway.client.subscriber": ("Checkpoint", "Delivery", "Received", "Subscriber", "SubscriberStats"),
    "gateway.mcast": ("Endpoint", "Tuning"),
    "gateway.reconcile": ("Start", "State"),
    "gateway.transport.curve": ("CurveClientKeys", "CurveServerKeys"),
    "gateway.transport.pgm": ("PgmSettings",),
    "gateway.wire.streamkey": ("StreamKey",),
}
_WHERE = {name: module for module, names in _LAZY.items() for name in names}

__version__ = "0.2.0"  # CHANGELOG.md: what changed, and the wire and journal formats' compatibility

__all__ = [
    "AsyncPublisher",
    "AsyncSubscriber",
    "AuthError",
    "BadRecord",
    "BadRecordType",
    "BatchError",
    "BufferFull",
    "Checkpoint",
    "Closed",
    "ConfigError",
    "CurveClientKeys",
    "CurveServerKeys",
    "DataLoss",
    "Delivery",
    "Directory",
    "DiscoveryError",
    "Endpoint",
    "EtcdDirectory",
    "FileDirectory",
    "Holder",
    "JournalCorrupt",
    "JournalError",
    "JournalLocked",
    "JournalTrimmed",
    "LanDirectory",
    "McastError",
    "NotAJournal",
    "NotGranted",
    "PgmSettings",
    "ProtocolError",
    "PublishError",
    "Publisher",
    "Received",
    "ReplayClient",
    "ReplayError",
    "ReplayRefused",
    "SlowConsumer",
    "Start",
    "State",
    "StreamInfo",
    "StreamKey",
    "Subscriber",
    "SubscriberStats",
    "Tuning",
    "Unauthenticated",
    "ZepsError",
    "__version__",
    "history",
    "snapshot",
]


def __getattr__(name: str) -> object:
    """A public name not imported yet: imported now, and kept."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'gateway' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
