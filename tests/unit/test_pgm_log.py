"""libpgm's messages into our log (gateway.transport.pgm_log): once per kind in an interval, the rest counted."""

from __future__ import annotations

from gateway.transport.pgm_log import Throttle


def test_a_kind_of_message_is_said_once_per_interval_and_the_rest_counted() -> None:
    throttle = Throttle(every_s=10.0)
    assert throttle.take("sendto() 239.192.1.1 failed: Operation not permitted", 0.0) == 0
    for i in range(50):  # a partition: one per packet, other addresses too
        assert throttle.take(f"sendto() 239.192.1.{i % 3} failed: Operation not permitted", 1.0 + i / 10) is None
    assert throttle.take("blocked socket failed: Bad file descriptor", 2.0) == 0  # another kind is its own
    assert throttle.take("sendto() 239.192.1.1 failed: Operation not permitted", 10.5) == 50
    assert throttle.take("sendto() 239.192.1.1 failed: Operation not permitted", 21.0) == 0
