"""Two sites for cross-site tests (site mirroring, subscribers across a WAN): netlab.Sites with the hosts the
tests name, the issue's WAN, and ZEPS deployments (gateway + replay sidecar) on either site's gateway host.

Hosts: site A a-gw, a-sub, a-spare; site B b-gw, b-sub, b-spare; the router between them. A deployment on
site S runs on S-gw, with feedlab's stream ("feed") and its multicast groups on S's LAN only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from support.feedlab import STREAM

from gateway.tools.deployment import Deployment
from netlab import Impairment, Sites

A_HOSTS = ("a-gw", "a-sub", "a-spare")
B_HOSTS = ("b-gw", "b-sub", "b-spare")
WAN = Impairment(delay_ms=30, loss_pct=1)  # each way: a round trip of 60 ms, 1% of the packets lost each way
WAN_CAPPED = Impairment(delay_ms=30, loss_pct=1, rate_kbit=100_000)  # the same behind a 100 Mbit/s shaper


@contextlib.contextmanager
def two_sites(
    wan: Impairment | None = WAN,
    name: str | None = None,
    *,
    a: Sequence[str] = A_HOSTS,
    b: Sequence[str] = B_HOSTS,
) -> Iterator[Sites]:
    """The two sites with hosts ``a`` and ``b``, up with ``wan`` on both directions (None: a perfect WAN); down
    at the end, pass or fail. Fails, never skips, without root."""
    with Sites(a, b, name, wan=wan) as sites:
        yield sites


@contextlib.contextmanager
def deployed(sites: Sites, site: str, journal: Path, **options: Any) -> Iterator[Deployment]:
    """`zeps gateway` and `zeps replay` on host "{site}-gw" of ``site`` ("a" or "b"), journaling in ``journal``,
    serving feedlab's stream; ``options`` go to Deployment (feeds, transport, gateway_args, keys). Stopped at the
    end; a server that did not exit cleanly fails the test."""
    dep = Deployment(sites.lab(site), journal, STREAM, host=f"{site}-gw", **options)
    try:
        yield dep
    finally:
        problems = dep.close()
    assert not problems, problems
