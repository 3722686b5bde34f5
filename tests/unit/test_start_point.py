"""One parser for where to start reading (gateway.client.start_point), with one time-zone rule, and the
Subscriber's checks of its arguments, made before any socket is opened."""

from __future__ import annotations

import inspect
from datetime import UTC, datetime, timedelta, timezone

import pytest

from gateway.client.async_subscriber import AsyncSubscriber
from gateway.client.start_point import StartPoint, parse_start, parse_time
from gateway.client.subscriber import Subscriber
from gateway.errors import ConfigError, ZepsError


def test_every_form_of_a_start_point() -> None:
    assert parse_start("earliest") == StartPoint(word="earliest")
    assert parse_start(42) == parse_start("42") == StartPoint(seq=42)
    assert parse_start(-10) == parse_start("-10") == StartPoint(back=10)
    second = StartPoint(time_ns=10**9)
    assert parse_start("1970-01-01T00:00:01Z") == parse_start("1970-01-01T01:00:01+01:00") == second
    assert parse_start(datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC)) == second
    assert parse_start(datetime(1970, 1, 1, 2, 0, 1, tzinfo=timezone(timedelta(hours=2)))) == second
    assert parse_time("1970-01-01T00:00:01.5Z") == 1_500_000_000


def test_one_time_zone_rule_a_time_names_its_zone() -> None:
    for naive in ("2026-05-01T09:30:00", datetime(2026, 5, 1, 9, 30)):
        with pytest.raises(ConfigError, match="names no time zone: add Z"):
            parse_start(naive)
    with pytest.raises(ConfigError, match="names no time zone"):
        parse_time("2026-05-01T09:30:00")


def test_a_bad_start_point_lists_what_is_valid() -> None:
    with pytest.raises(ConfigError, match=r"'earlist' is not earliest \| latest \| snapshot \| SEQ \| -N"):
        parse_start("earlist")
    with pytest.raises(ConfigError, match="N >= 1"):
        parse_start("-0")
    with pytest.raises(ConfigError, match="float"):
        parse_start(1.5)  # type: ignore[arg-type]


def test_the_subscriber_checks_its_arguments_before_any_socket() -> None:
    with pytest.raises(ConfigError, match=r"start: 'earlist' is not earliest \| latest \| snapshot"):
        Subscriber("o", replay="tcp://127.0.0.1:5571", start="earlist")
    with pytest.raises(TypeError, match="give key prefixes as str"):
        Subscriber("o", replay="tcp://127.0.0.1:5571", topics=[b"eu."])  # type: ignore[list-item]
    with pytest.raises(ConfigError, match=r"has no transport: write tcp://127\.0\.0\.1:5571"):
        Subscriber("o", replay="127.0.0.1:5571")
    with pytest.raises(ConfigError, match="lag_policy 'drop'"):
        Subscriber("o", replay="tcp://127.0.0.1:5571", lag_policy="drop")  # type: ignore[arg-type]
    # Checked at once, not by the reconciler once a start probe has answered (from next())
    with pytest.raises(ConfigError, match="max_lag 0: give a number of records >= 1"):
        Subscriber("o", replay="tcp://127.0.0.1:5571", max_lag=0)
    with pytest.raises(ConfigError, match="progress_timeout 0: give a number of seconds > 0"):
        Subscriber("o", replay="tcp://127.0.0.1:5571", progress_timeout=0)
    with pytest.raises(ZepsError) as no_endpoints:
        Subscriber("o")
    said = str(no_endpoints.value)
    assert "multicast=" in said and "replay=" in said and "interface=" in said and "--" not in said, said


def test_the_async_subscriber_has_the_subscribers_signature() -> None:
    def parameters(cls: type) -> list[inspect.Parameter]:
        return list(inspect.signature(cls).parameters.values())

    assert parameters(AsyncSubscriber) == parameters(Subscriber)
    assert all(p.kind is not p.VAR_KEYWORD for p in parameters(AsyncSubscriber))


def test_help_says_what_the_arguments_accept() -> None:
    doc = inspect.getdoc(Subscriber) or ""
    for said in ("`start`", '"earliest"', "-N (the last N records)", "`topics`", "one prefix as a str",
                 "`checkpoint`", "resumes after it", "`lag_policy`", "SlowConsumer"):  # fmt: skip
        assert said in doc, said
