"""The data pipeline on Apache Spark: the `zeps` PySpark data source, `zeps export` and `zeps analyze`.

Spark is an optional extra. This module imports nothing of it, so `import gateway` and every other command
work without pyspark; `require()` and `session()` say how to add Spark when it is missing. The parts:

- `gateway.spark.source`: the `zeps` data source (batch over journal directories, streaming over the replay
  sidecar). Registered on every session made here: ``spark.read.format("zeps")``.
- `gateway.spark.arrow`: journal batches to Arrow record batches (the hot path, numpy, no per-record objects).
- `gateway.spark.export`, `gateway.spark.analyze`: the jobs behind the two commands.

See docs/spark.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

from gateway.errors import ZepsError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)


class SparkUnavailable(ZepsError, RuntimeError):
    """Spark cannot run here: pyspark (or pyarrow, numpy) is not installed, or Java is missing."""


INSTALL_HINT = "install the spark extra: pip install 'zeps-gateway[spark]' (and Java 17)"
JAVA_HINT = (
    "Spark needs Java 17: apt-get install openjdk-17-jre-headless (Debian 12), or set JAVA_HOME to a Java 17 "
    "installation"
)


def require() -> None:
    """Raise SparkUnavailable, naming the fix, unless the Spark extra is importable."""
    missing = [name for name in ("pyspark", "pyarrow", "numpy") if not _importable(name)]
    if missing:
        raise SparkUnavailable(f"{', '.join(missing)} not installed; {INSTALL_HINT}")


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # sys.modules[name] = None, or a broken half-import
        return False


def _java_present() -> bool:
    home = os.environ.get("JAVA_HOME")
    return bool(home and os.access(os.path.join(home, "bin", "java"), os.X_OK)) or shutil.which("java") is not None


def get_session(
    app: str = "zeps",
    *,
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
    log_level: str = "ERROR",
) -> SparkSession:
    """The active Spark session, or a new one, with the `zeps` data source registered.

    `master` None keeps what the environment says (spark-submit's --master, else Spark's default local[*]).
    A local Spark started here binds to loopback (SPARK_LOCAL_IP, unless set).
    Python workers run this interpreter unless PYSPARK_PYTHON says otherwise: the package must be importable
    where the readers run (docs/spark.md: the package on executors).
    """
    require()
    from pyspark.errors import PySparkException
    from pyspark.sql import SparkSession

    from gateway.spark.source import ZepsDataSource

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    starts_jvm = SparkSession.getActiveSession() is None and "PYSPARK_GATEWAY_PORT" not in os.environ
    if starts_jvm and (master or "local").startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # Spark on this machine alone needs no network
    # zeps commands show their own progress (gateway.spark.progress): quiet unless on a terminal.
    builder = SparkSession.builder.appName(app).config("spark.ui.showConsoleProgress", "false")
    if master:
        builder = builder.master(master)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    if starts_jvm and not _java_present():
        raise SparkUnavailable(f"no java found; {JAVA_HINT}")
    try:
        spark = builder.getOrCreate()
    except PySparkException as exc:
        raise SparkUnavailable(f"Spark did not start ({exc}); {JAVA_HINT}") from None
    spark.sparkContext.setLogLevel(log_level)
    logging.getLogger("py4j").setLevel(logging.WARNING)  # it logs every connection at INFO
    spark.dataSource.register(ZepsDataSource)
    return spark


@contextmanager
def session(app: str, *, master: str | None = None, verbose: int = 0) -> Iterator[SparkSession]:
    """A session for one command: stopped at the end if this call started it (a running one is left alone)."""
    require()
    from pyspark.sql import SparkSession

    started = SparkSession.getActiveSession() is None
    spark = get_session(app, master=master, log_level=("FATAL", "WARN", "INFO")[min(verbose, 2)])
    try:
        yield spark
    finally:
        if started:
            spark.stop()


def run_command(name: str, args: argparse.Namespace, job: Callable[[SparkSession], int]) -> int:
    """Run a `zeps` Spark command (`args` carries master and verbose) in a session of its own.

    Spark missing, or Java: exit status 2 and the fix, like every other user error of the CLI. A job that
    fails (a corrupt journal, say): status 1 and one line, the error our code raised inside Spark; the JVM's
    stack traces only with -v (`verbosity`, else `verbose`, sets Spark's log level).
    """
    verbose = max(0, getattr(args, "verbosity", args.verbose))
    try:
        with session(name, master=args.master, verbose=verbose) as spark:
            return job(spark)
    except SparkUnavailable as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        if not type(exc).__module__.startswith(("py4j", "pyspark")):
            raise
        log.debug("%s: Spark job failed", name, exc_info=True)
        print(f"{name}: {job_failure(str(exc))}", file=sys.stderr)
        return 1


_RAISED = re.compile(r"^(?:gateway\.errors\.)?(\w+(?:Error|Corrupt|Trimmed|Locked|Journal)): (.+)$", re.M)


def job_failure(text: str) -> str:
    """The one line worth showing of a failed Spark job: the last exception raised in our Python code (Spark
    wraps it in a Java exception and pages of JVM frames), else the first line of what Spark said."""
    found = [m for m in _RAISED.finditer(text) if not m.group(1).startswith(("Py4J", "Spark", "java"))]
    if found:
        return found[-1].group(2).strip()
    return next((line.strip() for line in text.splitlines() if line.strip()), "the Spark job failed (run with -v)")
