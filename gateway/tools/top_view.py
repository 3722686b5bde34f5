"""`zeps top`'s screen: the view of gateway.tools.top as rich tables, one per part of the deployment.

Streams (per gateway), multicast outputs, replay sidecars, subscribers, site mirrors, then problems (targets down
and every error counter that is not 0): the order in which data flows. Numbers are exact where they identify something
(sequences) and short where they measure (12.3k, 4.5MB). Red is wrong; yellow needs a look.
"""

from __future__ import annotations

import time
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

KINDS = ("gateway", "replay", "subscriber", "mirror")
_NAMES = {"gateway": "gateway", "replay": "sidecar", "subscriber": "subscriber", "mirror": "mirror"}
MIRROR_LATE_S = 10.0  # a mirror this far behind its source shows red
_STATE_STYLE = {"MERGED": "green", "CATCHING_UP": "yellow", "RECOVERING": "yellow", "CLOSED": "red"}


def short(n: float | None, unit: str = "") -> str:
    """12_345 -> '12.3k'; None (no rate yet) -> '-'."""
    if n is None:
        return "-"
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.1f}{suffix}{unit}"
    return f"{n:.0f}{unit}" if n == int(n) or abs(n) >= 10 else f"{n:.1f}{unit}"


def _table(title: str, columns: tuple[str, ...], left: int) -> Table:
    table = Table(
        title=title, title_justify="left", title_style="bold", box=box.SIMPLE_HEAD, show_edge=False, expand=True
    )
    for i, name in enumerate(columns):
        table.add_column(name, justify="left" if i < left else "right", no_wrap=True)
    return table


class _Section:
    """One table over the targets of one kind: with one target its address goes in the title, else in a column."""

    def __init__(self, title: str, entries: list[dict[str, Any]], who: str, *columns: str, left: int = 1) -> None:
        """`left`: how many of `columns` hold names (left-aligned); the rest hold numbers."""
        self.many = len(entries) > 1
        if entries and not self.many:
            title += f"  ·  {who} {entries[0]['address']}"
        self.table = _table(title, ((who,) if self.many else ()) + columns, left + self.many)

    def row(self, entry: dict[str, Any], *cells: str | Text) -> None:
        self.table.add_row(*((entry["address"],) if self.many else ()), *cells)

    def down(self, entry: dict[str, Any]) -> None:
        self.row(entry, Text("DOWN", style="bold red"))


def _streams(view: dict[str, Any]) -> Table:
    t = _Section(
        "Streams",
        view["gateway"],
        "gateway",
        "stream",
        "head",
        "rec/s",
        "bytes/s",
        "journaled",
        "publishers",
        "journal",
    )
    for gw in view["gateway"]:
        if not gw["up"]:
            t.down(gw)
            continue
        for name, s in gw["streams"].items():
            t.row(
                gw,
                name,
                f"{s['head']:,}",
                short(s["records_per_s"]),
                short(s["bytes_per_s"], "B"),
                short(s["journaled_bytes"], "B"),
                str(s["publishers"]),
                Text("FULL", style="bold red") if s["journal_full"] else Text("ok", style="green"),
            )
    return t.table


def _multicast(view: dict[str, Any]) -> Table | None:
    t = _table("Multicast", ("endpoint", "stream", "sent", "behind", "msg/s", "bytes/s", "queue"), 2)
    for gw in view["gateway"]:
        for out in gw.get("multicast", ()):
            for name, s in out["streams"].items():
                t.add_row(
                    out["endpoint"],
                    name,
                    f"{s['sent_head']:,}",
                    Text(f"{s['behind_records']:,}", style="yellow" if s["behind_records"] else ""),
                    short(s["messages_per_s"]),
                    short(s["bytes_per_s"], "B"),
                    str(out["queue_messages"]),
                )
    return t if t.row_count else None


def _replay(view: dict[str, Any]) -> Table:
    t = _Section(
        "Replay",
        view["replay"],
        "sidecar",
        "stream",
        "clients",
        "live",
        "credit",
        "rec/s",
        "bytes/s",
        "fetch/s",
        "stalls",
    )
    for rp in view["replay"]:
        if not rp["up"]:
            t.down(rp)
            continue
        for name, s in rp["streams"].items():
            t.row(
                rp,
                name,
                str(s["clients"]),
                str(s["tail_clients"]),
                short(s["credit_bytes"], "B"),
                short(s["records_per_s"]),
                short(s["bytes_per_s"], "B"),
                short(s["fetches_per_s"]),
                Text(short(s["credit_stalls"] + s["send_stalls"]), style="yellow" if s["send_stalls"] else ""),
            )
    return t.table


def _subscribers(view: dict[str, Any]) -> Table:
    t = _Section(
        "Subscribers",
        view["subscriber"],
        "subscriber",
        *("stream", "state", "head", "lag", "rec/s", "live/replay", "gaps filled", "lost", "reconnects"),
        left=2,
    )
    for sub in view["subscriber"]:
        if not sub["up"]:
            t.down(sub)
            continue
        for name, s in sub["streams"].items():
            by = s["delivered_by_source"]
            t.row(
                sub,
                name,
                Text(s["state"] or "?", style=_STATE_STYLE.get(s["state"] or "", "")),
                f"{s['head']:,}",
                Text(f"{s['lag_records']:,}", style="yellow" if s["lag_records"] > 1000 else ""),
                short(s["records_per_s"]),
                f"{short(by.get('live', 0))}/{short(by.get('replay', 0))}",
                f"{s['gaps_filled']}/{s['gaps_detected']}",
                Text(f"{s['lost_records']:,}", style="bold red" if s["lost_records"] else ""),
                str(s["replay_reconnects"]),
            )
    return t.table


def _mirrors(view: dict[str, Any]) -> RenderableType:
    """The table; under it, a line per stream mirrored over more than one path (`--paths`): each path's state."""
    t = _Section("Mirrors", view["mirror"], "mirror", "stream", "head", "source head", "behind", "behind s", "rec/s",
                 "resumes")  # fmt: skip
    lines: list[Text] = []
    for mirror in view["mirror"]:
        if not mirror["up"]:
            t.down(mirror)
            continue
        for name, s in mirror["streams"].items():
            late = "red" if s["lag_seconds"] >= MIRROR_LATE_S else "yellow" if s["lag_records"] else ""
            t.row(
                mirror,
                name,
                f"{s['head']:,}",
                f"{s['source_head']:,}",
                Text(f"{s['lag_records']:,}", style=late),
                Text(f"{s['lag_seconds']:.3f}", style=late),
                short(s["records_per_s"]),
                Text(str(s["resumes"]), style="yellow" if s["resumes"] else ""),
            )
            if len(s["paths"]) > 1:
                who = f"{mirror['address']} " if t.many else ""
                lines.append(Text.assemble(f"  {who}{name} paths:", *_paths(s["paths"])))
    return Group(t.table, *lines) if lines else t.table


def _paths(paths: dict[str, dict[str, Any]]) -> list[str | tuple[str, str]]:
    """` · `-joined: `#1 up 12.3k/s won 4.5k idle 0.0s`, then `reconnects N` if any; a path down in red."""
    parts: list[str | tuple[str, str]] = []
    for path, p in paths.items():
        parts.append(" ·" if parts else "")
        parts.append((f" #{path} up", "green") if p["up"] else (f" #{path} DOWN", "bold red"))
        parts.append(f" {short(p['records_per_s'])}/s won {short(p['first_arrivals'])} idle {p['idle_seconds']:.1f}s")
        if p["reconnects"]:
            parts.append((f" reconnects {p['reconnects']}", "yellow"))
    return parts


def _problems(view: dict[str, Any]) -> Text:
    lines = []
    for kind in KINDS:
        for entry in view[kind]:
            if not entry["up"]:
                lines.append(f"{kind} {entry['address']} is DOWN: {entry['error']}")
            lines.extend(f"{kind} {entry['address']}: {problem}" for problem in entry.get("problems", ()))
    if not lines:
        return Text("Problems: none (every target up, no error counter moved)", style="green")
    return Text("Problems:\n  " + "\n  ".join(lines), style="red")


def render(view: dict[str, Any], interval: float) -> RenderableType:
    counts = ", ".join(f"{len(view[k])} {_NAMES[k]}{'s' if len(view[k]) != 1 else ''}" for k in KINDS if view[k])
    clock = time.strftime("%H:%M:%S", time.localtime(view["time"]))
    header = Text.assemble(("zeps top", "bold"), f" · {counts} · {clock} · every {interval:g} s · Ctrl-C quits")
    parts: list[RenderableType | None] = [header]
    if view["gateway"]:
        parts += [_streams(view), _multicast(view)]
    if view["replay"]:
        parts.append(_replay(view))
    if view["subscriber"]:
        parts.append(_subscribers(view))
    if view["mirror"]:
        parts.append(_mirrors(view))
    parts.append(_problems(view))
    spaced: list[RenderableType] = []
    for part in parts:
        if part is not None:
            spaced += [part, Text("")]
    return Group(*spaced[:-1])
