"""Streaming rates of the `zeps` data source on a Spark standalone cluster (docs/spark.md, "Measured here").

The cluster of tests/lab/test_spark_cluster.py (master, two 1-core workers, a driver, each on a lab host; the
sidecar and a gateway on host gw), a journal of 1,000,000 records (100-byte bodies, 50 keys, 100 records a
batch), then `--runs` times: a streaming read from the sidecar into Parquet, and the same read through the
`zeps` sink into the gateway. Prints each run's records/s, the medians and the load average. Needs root.
With --local, the same driver runs `local[2]` on its host instead (no cluster): the figure to compare with.

    .venv/bin/python scripts/spark_cluster_rates.py [--runs 3] [--records 1000000] [--local]
                                                    [--records-per-partition 100000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the cluster helper lives with the tests

from support.servers import Stream
from support.spark_cluster import Cluster, gateway_host, rates

from netlab import Lab

PER_BATCH = 100


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--records-per-partition", type=int, default=100_000, help="records a task reads")
    parser.add_argument("--local", action="store_true", help="local[2] on the driver's host, no cluster")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="zeps-cluster-rates-") as tmp,
        Lab(["gw", "master", "w1", "w2", "drv"]) as lab,
    ):
        root = Path(tmp)
        stream = Stream(root / "journal", "ticks")
        stream.write(args.records // PER_BATCH, PER_BATCH, keys=50)
        stream.writer.close()
        (root / "driver").mkdir()
        load = [os.getloadavg()[0]]
        with gateway_host(lab, root) as (replay, ingest):
            spark = None if args.local else Cluster(lab, root / "spark")
            try:
                master, driver = "local[2]" if spark is None else spark.url, lab.host("drv").ip
                got = lab.run("drv", rates, master, driver, str(root / "driver"), replay, "ticks", ingest,
                              "derived", args.runs, args.records_per_partition, timeout=3_600)  # fmt: skip
            finally:
                if spark is not None:
                    spark.stop()
        load.append(os.getloadavg()[0])
    for what, seconds in got.items():
        each = ", ".join(f"{args.records / s / 1000:.0f} k" for s in seconds)
        median = statistics.median(seconds)
        print(f"{what}: median {median:.1f} s = {args.records / median / 1000:.0f} k records/s (runs: {each})")
    print(f"load average (1 min) at start and end: {load[0]:.1f}, {load[1]:.1f}")


if __name__ == "__main__":
    main()
