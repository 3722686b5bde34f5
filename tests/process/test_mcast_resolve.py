"""Endpoint.resolve asks the kernel (netlink) for an interface's address: an unknown name is one clear error."""

from __future__ import annotations

import pytest

from gateway.errors import McastError
from gateway.mcast import Endpoint


def test_resolving_an_unknown_interface_names_it() -> None:
    with pytest.raises(McastError, match="no interface named 'nosuchif0'"):
        Endpoint.parse("epgm://nosuchif0;239.1.1.1:5555").resolve()
