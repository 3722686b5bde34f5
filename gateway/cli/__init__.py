"""One module per `zeps` subcommand, each with `register(commands)` adding its parser and handler.

Handlers import their library modules lazily so that `zeps --help` stays fast and a missing optional
dependency (e.g. Spark) only matters to the command that needs it.
"""

MODULES = (
    "analyze",
    "bench",
    "demo",
    "doctor",
    "export",
    "gateway",
    "ha",
    "history",
    "journal",
    "keygen",
    "mirror",
    "publish",
    "replay",
    "snapshot",
    "streams",
    "subscribe",
    "top",
)
