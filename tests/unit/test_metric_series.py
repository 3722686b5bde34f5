"""The metrics registries (series at 0 from the start, no `_created`) and `zeps top`'s view of them."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.sequencer.metrics import GatewayMetrics
from gateway.tools.top import Samples, _gateway, _Scrape

ENDPOINT = "udp://10.0.0.1;239.192.0.1:5000"


def samples(metrics: GatewayMetrics) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


class Writer:
    last_seq = 0


def test_multicast_series_exist_per_endpoint_and_stream_from_the_start() -> None:
    m = GatewayMetrics(["a", "b"])
    sent = {"a": 7, "b": 0}
    m.add_output(ENDPOINT, sent)
    got = samples(m)
    for stream in ("a", "b"):
        for name in ("zeps_gateway_multicast_messages_total", "zeps_gateway_multicast_bytes_total"):
            assert ({"endpoint": ENDPOINT, "stream": stream}, 0.0) in got[name]
        assert ({"endpoint": ENDPOINT, "stream": stream}, 0.0) in got["zeps_gateway_heartbeats_total"]
    assert ({"endpoint": ENDPOINT, "stream": "a"}, 7.0) in got["zeps_gateway_multicast_head_sequence"]
    sent["a"] = 9  # read when scraped
    assert ({"endpoint": ENDPOINT, "stream": "a"}, 9.0) in samples(m)["zeps_gateway_multicast_head_sequence"]
    assert not [name for name in got if name.endswith("_created")]


def test_top_computes_rates_and_lists_moved_error_counters() -> None:
    m = GatewayMetrics(["a", "b"])
    writer = Writer()
    m.follow_head("a", writer)
    m.follow_head("b", Writer())
    m.add_output(ENDPOINT, {"a": 0, "b": 0})
    before = samples(m)
    writer.last_seq = 500
    m.streams["a"].journaled.add(500)
    m.streams["a"].journaled_bytes.add(50_000)
    m.outputs[ENDPOINT].messages["a"].add(5)
    m.rejected.labels("invalid").inc()
    s = _Scrape(samples(m), before, 2.0)  # the loop's tallies are read when scraped
    view = _gateway(s)
    a = view["streams"]["a"]
    assert (a["head"], a["records_per_s"], a["bytes_per_s"]) == (500, 250.0, 25_000.0)
    assert view["streams"]["b"]["records_per_s"] == 0.0
    [out] = view["multicast"]
    assert out["streams"]["a"]["behind_records"] == 500 and out["streams"]["a"]["messages_per_s"] == 2.5
    assert s.problems("gateway") == ["gateway_rejected_messages_total{kind=invalid} 1"]
    # Without a previous scrape, or across a restart (a counter went down), there is no rate.
    assert _Scrape(samples(m), None, 0.0).rate("zeps_gateway_journaled_records_total", stream="a") is None
    assert _Scrape(before, samples(m), 1.0).rate("zeps_gateway_journaled_records_total", stream="a") is None


def test_the_loops_tallies_read_when_scraped_as_counters_and_a_histogram() -> None:
    m = GatewayMetrics(["a"])
    series = m.streams["a"]
    before = samples(m)
    assert ({"stream": "a"}, 0.0) in before["zeps_gateway_published_records_total"]
    assert ({"stream": "a", "le": "+Inf"}, 0.0) in before["zeps_gateway_batch_records_bucket"]
    series.published.add(3)
    for count in (1, 1, 5, 5000):
        series.batch_records.observe(count)
    got = samples(m)
    assert ({"stream": "a"}, 3.0) in got["zeps_gateway_published_records_total"]
    buckets = {labels["le"]: value for labels, value in got["zeps_gateway_batch_records_bucket"]}
    assert buckets == {"1.0": 2, "4.0": 2, "16.0": 3, "64.0": 3, "256.0": 3, "1024.0": 3, "4096.0": 3, "+Inf": 4}
    assert got["zeps_gateway_batch_records_sum"] == [({"stream": "a"}, 5007.0)]
    assert got["zeps_gateway_batch_records_count"] == [({"stream": "a"}, 4.0)]
