"""gateway.transport.descriptors: the gateway makes room for --max-clients connections in its open-files limit."""

from __future__ import annotations

import resource
from collections.abc import Iterator

import pytest

from gateway.transport.descriptors import make_room

NOFILE = resource.RLIMIT_NOFILE


@pytest.fixture
def low_soft_limit() -> Iterator[int]:
    """The soft limit lowered to 512 for the test (the hard one kept), restored after."""
    soft, hard = resource.getrlimit(NOFILE)
    resource.setrlimit(NOFILE, (512, hard))
    try:
        yield hard
    finally:
        resource.setrlimit(NOFILE, (soft, hard))


def test_the_soft_limit_is_raised_to_what_is_needed_and_never_lowered(low_soft_limit: int) -> None:
    assert make_room(600) is None
    assert resource.getrlimit(NOFILE)[0] == 600
    assert make_room(100) is None
    assert resource.getrlimit(NOFILE)[0] == 600


def test_past_the_hard_limit_it_raises_to_the_hard_one_and_names_the_fix(low_soft_limit: int) -> None:
    hard = low_soft_limit
    if hard == resource.RLIM_INFINITY:
        pytest.fail("this test needs a finite hard limit of open files (ulimit -Hn)", pytrace=False)
    short = make_room(hard + 1)
    assert short is not None and f"hard limit is {hard}" in short and f"ulimit -Hn {hard + 1}" in short
    assert resource.getrlimit(NOFILE)[0] == hard
