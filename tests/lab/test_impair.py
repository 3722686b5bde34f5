"""netlab.impair: every impairment has the measured effect it claims, can change under traffic, and goes away.

Traffic is a netlab probe: numbered multicast datagrams, paced, from ``pub`` to ``sub`` (multicast needs no
ARP, which random loss would otherwise disturb). One-way delays come from one monotonic clock: all hosts are
namespaces of this machine.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from netlab import Impairment, Lab, LabError, impair
from netlab.packets import Probe, probe, start_probe

pytestmark = pytest.mark.lab

NETLAB_CLI = Path(sys.executable).parent / "netlab"


def loss_pct(result: Probe) -> float:
    return 100 * len(result.lost()) / result.sent


def percentile(values: list[float], pct: int) -> float:
    return statistics.quantiles(values, n=100)[pct - 1]


def wait_seen(lab: Lab, host: str, packets: int, timeout: float = 10.0) -> int:
    """Block until ``host``'s inbound hook has seen ``packets`` packets; return the count then."""
    deadline = time.monotonic() + timeout
    while (seen := impair.counters(lab, host).seen) < packets:
        assert time.monotonic() < deadline, f"only {seen} of {packets} packets reached {host} in {timeout} s"
        time.sleep(0.002)
    return seen


def test_impairment_validates_and_describes_itself() -> None:
    with pytest.raises(ValueError, match="needs delay_ms"):
        Impairment(reorder_pct=5)
    with pytest.raises(ValueError, match="loss_burst"):
        Impairment(loss_burst=10)
    with pytest.raises(ValueError, match="percentage"):
        Impairment(loss_pct=120)
    assert Impairment().is_clear
    text = Impairment(loss_pct=5, loss_burst=10, delay_ms=2, jitter_ms=1, rate_kbit=10_000).describe()
    assert text == "loss 5% burst 10, delay 2ms jitter 1ms, rate 10mbit"


def test_random_loss_then_clear(lab: Lab) -> None:
    imp = Impairment(loss_pct=20)
    impair.impair(lab, "sub", imp)
    assert impair.current(lab, "sub") == imp
    assert impair.current(lab, "sub", "out") is None
    lossy = probe(lab, "pub", "sub", count=2000, pps=4000)
    assert 15 <= loss_pct(lossy) <= 25
    counters = impair.counters(lab, "sub")
    # The hook also sees the hosts' own few IGMP/IPv6 multicast packets, and may drop those.
    assert 0 <= counters.dropped - len(lossy.lost()) <= counters.seen - 2000 < 10
    assert max(lossy.loss_runs()) < 10  # independent losses: a run of 10 has probability 1e-7

    impair.clear(lab, "sub")
    assert impair.current(lab, "sub") is None
    clean = probe(lab, "pub", "sub", count=2000, pps=4000)
    assert clean.lost() == [] and clean.duplicates == 0


def test_gilbert_loss_comes_in_bursts(lab: Lab) -> None:
    imp = Impairment(loss_pct=10, loss_burst=8)
    impair.impair(lab, "sub", imp)
    assert impair.current(lab, "sub") == imp
    result = probe(lab, "pub", "sub", count=4000, pps=8000)
    runs = result.loss_runs()
    assert 4 <= loss_pct(result) <= 18
    assert statistics.mean(runs) >= 4, runs  # Bernoulli loss of 10% would give runs of 1.1 on average


def test_drop_next_drops_exactly_n_consecutive_datagrams_to_one_port(lab: Lab) -> None:
    impair.drop_next(lab, "sub", 1000, udp_port=5001)
    assert impair.counters(lab, "sub").burst_left == 1000
    run = start_probe(lab, "pub", "sub", ports=(5001, 5002), count=3000, pps=5000)
    counters = impair.wait_burst(lab, "sub", timeout=10)
    result = run.result()
    assert result.lost(5001) == list(range(0, 2000, 2))  # the first 1000 datagrams to 5001, and no others
    assert result.lost(5002) == []
    assert counters.burst_dropped == counters.dropped == 1000 and counters.burst_left == 0


def test_duplication_adds_copies(lab: Lab) -> None:
    impair.impair(lab, "sub", Impairment(duplicate_pct=10))
    result = probe(lab, "pub", "sub", count=2000, pps=4000)
    assert result.lost() == []
    assert 100 <= result.duplicates <= 300
    counters = impair.counters(lab, "sub")
    assert 0 <= counters.duplicated - result.duplicates <= counters.seen - 2000 < 10  # + the hosts' own IGMP/IPv6


def test_delay_and_jitter_are_measured_one_way(lab: Lab) -> None:
    # The probe's receiver is a process too: on a loaded machine it adds its own lag to every delay measured.
    baseline = statistics.median(probe(lab, "pub", "sub", count=200, pps=1000).delays_ms())
    impair.impair(lab, "sub", Impairment(delay_ms=20))
    assert impair.current(lab, "sub") == Impairment(delay_ms=20)
    delayed = probe(lab, "pub", "sub", count=200, pps=1000).delays_ms()
    assert 19 <= statistics.median(delayed) <= 25
    assert percentile(delayed, 90) - percentile(delayed, 10) < 5  # no jitter asked for

    impair.impair(lab, "sub", Impairment(delay_ms=20, jitter_ms=8))
    jittered = probe(lab, "pub", "sub", count=400, pps=1000).delays_ms()
    assert len(jittered) == 400
    assert percentile(jittered, 10) < 16 and percentile(jittered, 90) > 24  # uniform in 12..28 ms

    impair.impair(lab, "sub", Impairment(delay_ms=10), direction="out")  # what sub sends, not what it gets
    assert statistics.median(probe(lab, "sub", "pub", count=200, pps=1000).delays_ms()) >= 9
    impair.clear(lab, "sub")
    assert statistics.median(probe(lab, "pub", "sub", count=200, pps=1000).delays_ms()) < baseline + 5


def test_reorder_lets_some_packets_overtake(lab: Lab) -> None:
    impair.impair(lab, "sub", Impairment(delay_ms=10, reorder_pct=25))
    result = probe(lab, "pub", "sub", count=1000, pps=2000)
    assert result.lost() == [] and result.duplicates == 0
    assert result.out_of_order > 100  # ~25% skip the 10 ms queue, i.e. overtake ~20 datagrams each


def test_rate_limit_caps_throughput(lab: Lab) -> None:
    impair.impair(lab, "sub", Impairment(rate_kbit=2000))
    assert impair.current(lab, "sub") == Impairment(rate_kbit=2000)
    result = probe(lab, "pub", "sub", count=750, pps=500, size=1000)  # 4 Mbit/s offered for 1.5 s
    # TBF counts Ethernet+IP+UDP headers too: 1000 bytes of payload are 1042 on the wire, i.e. 1920 kbit.
    assert 1600 <= result.throughput_kbit() <= 2200
    assert result.received < 0.75 * 750


def test_loss_changes_while_traffic_flows(lab: Lab) -> None:
    impair.impair(lab, "sub", Impairment())  # a perfect link, but the counters are there from the start
    run = start_probe(lab, "pub", "sub", count=3000, pps=3000)
    on = wait_seen(lab, "sub", 800)
    impair.impair(lab, "sub", Impairment(loss_pct=50))
    lossy_from = impair.counters(lab, "sub").seen
    off = wait_seen(lab, "sub", lossy_from + 1000)
    impair.impair(lab, "sub", Impairment())
    clean_from = impair.counters(lab, "sub").seen
    result = run.result()
    lost = result.lost()
    # seen also counts the IGMP report of the receiver's join: allow the sequence numbers to be off by 2.
    assert not [s for s in lost if s < on - 2 or s > clean_from + 2]
    middle = [s for s in lost if lossy_from + 2 <= s < off - 2]
    assert 0.35 <= len(middle) / (off - lossy_from - 4) <= 0.65


def test_delay_changes_while_traffic_flows_without_losing_packets(lab: Lab) -> None:
    impair.impair(lab, "sub", Impairment(delay_ms=5))
    run = start_probe(lab, "pub", "sub", count=4000, pps=2000)
    first = wait_seen(lab, "sub", 500)
    impair.impair(lab, "sub", Impairment(delay_ms=30))  # a new delay process takes over the queue
    swapped = impair.counters(lab, "sub").seen
    second = wait_seen(lab, "sub", swapped + 500)
    impair.impair(lab, "sub", Impairment())  # the old process releases what it holds, then exits
    cleared = impair.counters(lab, "sub").seen
    result = run.result()
    assert result.lost() == [] and result.duplicates == 0
    assert cleared < 3800, "the changes took too long to leave an undelayed stretch"
    assert 4 <= statistics.median(result.delays_ms(0, first)) <= 15
    assert 29 <= statistics.median(result.delays_ms(swapped + 50, second - 50)) <= 45
    assert statistics.median(result.delays_ms(cleared + 50)) < 5


def test_partition_and_heal(lab: Lab) -> None:
    impair.impair(lab, "sub", Impairment(loss_pct=5))
    impair.partition(lab, "sub")
    assert impair.counters(lab, "sub").partitioned and impair.counters(lab, "sub", "out").partitioned
    assert probe(lab, "pub", "sub", count=300, pps=3000).received == 0
    assert probe(lab, "sub", "pub", count=300, pps=3000).received == 0

    impair.heal(lab, "sub")
    assert not impair.counters(lab, "sub").partitioned
    assert impair.current(lab, "sub") == Impairment(loss_pct=5)  # other impairments stay
    impair.clear(lab, "sub")
    assert probe(lab, "sub", "pub", count=300, pps=3000).lost() == []
    assert probe(lab, "pub", "sub", count=300, pps=3000).lost() == []


def test_errors_name_the_cause(lab: Lab) -> None:
    with pytest.raises(ValueError, match="'in', 'out' or 'both'"):
        impair.impair(lab, "sub", Impairment(), direction="sideways")
    with pytest.raises(KeyError, match="no host 'nope'"):
        impair.clear(lab, "nope")
    with pytest.raises(LabError, match="call drop_next"):
        impair.wait_burst(lab, "sub", timeout=0.1)


def netlab_cli(*args: str) -> str:
    done = subprocess.run([str(NETLAB_CLI), *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_cli_sets_shows_and_clears(lab: Lab) -> None:
    sub = f"{lab.name}/sub"
    out = netlab_cli("impair", sub, "--loss", "5%", "--burst", "4", "--delay", "2ms", "--rate", "10mbit")
    assert f"{sub} in: loss 5% burst 4, delay 2ms, rate 10mbit" in out
    assert impair.current(lab, "sub") == Impairment(loss_pct=5, loss_burst=4, delay_ms=2, rate_kbit=10_000)
    netlab_cli("partition", sub)
    assert "PARTITIONED" in netlab_cli("status")
    netlab_cli("heal", sub)
    netlab_cli("drop", sub, "7", "--udp-port", "5000")
    assert impair.counters(lab, "sub").burst_left == 7
    assert f"{sub} in: none" in netlab_cli("impair", sub, "--clear")
    assert impair.current(lab, "sub") is None and impair.counters(lab, "sub").seen == 0
