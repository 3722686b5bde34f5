"""`zeps top`'s view of a site mirror: its metrics (gateway.client.mirror_metrics) read into the view, rendered."""

from __future__ import annotations

import re
import time

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from gateway.client.mirror import Mirror, MirrorConfig
from gateway.client.mirror_metrics import MirrorMetrics
from gateway.tools.top import Samples, _mirror, _Scrape
from gateway.tools.top_view import render


def samples(metrics: MirrorMetrics) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def a_mirror(paths: int = 1) -> tuple[Mirror, MirrorMetrics]:
    mirror = Mirror(MirrorConfig("orders", ("tcp://a:5571",), ("tcp://b:5570",), paths=paths))
    return mirror, MirrorMetrics(mirror)


def test_top_shows_how_far_the_mirror_is_behind_its_source_in_records_and_seconds() -> None:
    mirror, metrics = a_mirror()
    st = mirror.status
    st.head = st.mirrored_records = 1_000
    before = samples(metrics)
    st.head = st.mirrored_records = 5_000
    st.source_head, st.lag_seconds, st.resumes = 7_500, 2.25, 1
    view = _mirror(_Scrape(samples(metrics), before, 2.0))
    assert view == {
        "streams": {
            "orders": {
                "head": 5_000,
                "source_head": 7_500,
                "lag_records": 2_500,
                "lag_seconds": 2.25,
                "records_per_s": 2_000.0,
                "mirrored_records": 5_000,
                "resumes": 1,
                "paths": {
                    "1": {
                        "up": False,
                        "records_per_s": 0.0,
                        "records": 0,
                        "first_arrivals": 0,
                        "bytes": 0,
                        "idle_seconds": view["streams"]["orders"]["paths"]["1"]["idle_seconds"],
                        "reconnects": 0,
                    }
                },
            }
        }
    }
    assert _Scrape(samples(metrics), None, 0.0).problems("mirror") == []  # lag is shown, not an error counter


def screen(view: dict) -> str:
    console = Console(width=140, record=True, color_system=None)
    console.print(render(view, 1.0))
    return console.export_text()


def test_the_screen_has_a_row_per_mirror_and_stream_and_marks_one_that_is_down() -> None:
    mirror, metrics = a_mirror()
    mirror.status.head, mirror.status.source_head, mirror.status.lag_seconds = 4_200, 4_321, 0.125
    up = {"address": "10.0.0.9:9110", "up": True, **_mirror(_Scrape(samples(metrics), None, 0.0)), "problems": []}
    down = {"address": "10.0.0.10:9110", "up": False, "error": "connection refused"}
    view = {"time": 0.0, "gateway": [], "replay": [], "subscriber": [], "mirror": [up]}
    text = screen(view)
    assert "2 mirrors" not in text and "1 mirror " in text
    assert "Mirrors  ·  mirror 10.0.0.9:9110" in text
    [row] = [line for line in text.splitlines() if line.strip().startswith("orders")]
    assert row.split() == ["orders", "4,200", "4,321", "121", "0.125", "-", "0"]
    text = screen({**view, "mirror": [up, down]})
    assert ["10.0.0.10:9110", "DOWN"] in [line.split() for line in text.splitlines()]
    assert "mirror 10.0.0.10:9110 is DOWN: connection refused" in text


def test_a_mirror_over_several_paths_shows_each_path_on_a_line_of_its_own() -> None:
    """Which path is slow, down or replaced: per path (`path` label 1..N), the records taken from it, the live
    tail's first arrivals it carried, its idleness and reconnects."""
    mirror, metrics = a_mirror(paths=3)
    one, two, three = mirror.status.paths
    one.up = two.up = True
    before = samples(metrics)
    one.records, one.first_arrivals, one.bytes = 3_000, 1_000, 300_000
    two.records, two.first_arrivals = 1_000, 200
    three.reopens = 2
    two.arrived_at = time.monotonic() - 5.0
    view = _mirror(_Scrape(samples(metrics), before, 2.0))
    paths = view["streams"]["orders"]["paths"]
    assert list(paths) == ["1", "2", "3"]
    assert [
        (p["up"], p["records"], p["records_per_s"], p["first_arrivals"], p["reconnects"]) for p in paths.values()
    ] == [
        (True, 3_000, 1_500.0, 1_000, 0),
        (True, 1_000, 500.0, 200, 0),
        (False, 0, 0.0, 0, 2),
    ]
    assert paths["1"]["bytes"] == 300_000 and paths["2"]["idle_seconds"] >= 5.0
    entry = {"address": "10.0.0.9:9110", "up": True, **view, "problems": []}
    text = screen({"time": 0.0, "gateway": [], "replay": [], "subscriber": [], "mirror": [entry]})
    [line] = [re.sub(r"idle \d+\.\d+s", "idle Ns", line) for line in text.splitlines() if "paths:" in line]
    assert line.strip() == (
        "orders paths: #1 up 1.5k/s won 1.0k idle Ns · #2 up 500/s won 200 idle Ns · #3 DOWN 0/s won 0 idle Ns "
        "reconnects 2"
    )
