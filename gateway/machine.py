"""The table form every protocol machine of the project shares, after h11's _state.py and the reconciler.

A machine is a class whose state changes only through its table: per state a `Row` of event handlers (they
change data, never the state) and transitions `Go(guard, target, action)` in priority order, re-evaluated after
the handler and after the row's timers until none fires. `settle` runs one event through a table;
`describe` renders a table as Markdown, which the machine's doc embeds and a test keeps equal.

An event's kind, the key of `Row.on`, is its class unless the machine passes another (`settle(kind=...)`): a
machine that answers "any other command" alike passes a base class for those, one whose inputs are enum
members passes the member.

It sits at the bottom of the layers and imports nothing of the project, so that every machine can use it: the
servers' handshake (gateway.wire.handshake), the reconciler, the client's sessions, the gateway's ingest and the
sidecar's sessions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any, Generic, NamedTuple, TypeVar

M = TypeVar("M")
S = TypeVar("S", bound=Enum)


class Go(NamedTuple, Generic[M, S]):
    """A transition: when `guard` holds, go to `target`, running `action` on the way."""

    guard: Callable[[M], bool]
    target: S
    action: Callable[[M], None] | None = None


class Row(NamedTuple, Generic[M, S]):
    """Everything one state does."""

    #: event kind -> handler (None: the event means nothing here beyond running the transitions and timers);
    #: kinds not listed are ignored in this state
    on: Mapping[Any, Callable[[M, Any], None] | None]
    #: the transitions, first whose guard holds wins
    go: tuple[Go[M, S], ...] = ()
    #: run after every event, before the transitions are looked at again
    timers: tuple[Callable[[M], None], ...] = ()


def always(machine: object) -> bool:
    """The guard of a transition every event of its state takes."""
    return True


def settle(machine: M, table: Mapping[S, Row[M, S]], state: S, event: object, kind: object = None) -> S:
    """Run `event` (of `kind`, by default its class) through `table` from `state`: the handler, the transitions,
    the timers, the transitions again; the state it ends in."""
    row = table[state]
    handler = row.on.get(type(event) if kind is None else kind)
    if handler is not None:
        handler(machine, event)
    if row.go:  # a state without transitions stays (the handshake's NEGOTIATED, for every command after it)
        state, row = _transitions(machine, table, state, row)
    if row.timers:  # without timers nothing changed since the transitions were looked at
        for timer in row.timers:
            timer(machine)
        state, row = _transitions(machine, table, state, row)
    return state


def _transitions(machine: M, table: Mapping[S, Row[M, S]], state: S, row: Row[M, S]) -> tuple[S, Row[M, S]]:
    """Take the first transition whose guard holds, from each state reached, until none does."""
    for _ in range(len(table) + 1):
        for go in row.go:
            if go.guard(machine):
                state, row = go.target, table[go.target]
                if go.action is not None:
                    go.action(machine)
                break
        else:
            return state, row
    raise RuntimeError(f"{type(machine).__name__}: transitions cycle in {state!r}, a bug in its table")


def describe(table: Mapping[S, Row[M, S]], events: tuple[object, ...], names: Mapping[Any, str] | None = None) -> str:
    """`table` as two Markdown tables: the handler of each event kind per state, then the transitions and timers.
    A kind is shown by `names[kind]`, else by its class name or enum member name."""

    def name(method: Callable[..., Any] | None) -> str:
        return "—" if method is None else f"`{method.__name__.lstrip('_')}`"

    def label(kind: object) -> str:
        if names and kind in names:
            return names[kind]
        return kind.name if isinstance(kind, Enum) else getattr(kind, "__name__", str(kind))

    lines = ["| state | " + " | ".join(label(e) for e in events) + " |", "|---" * (len(events) + 1) + "|"]
    for state, row in table.items():
        cells = [name(row.on[kind]) if kind in row.on else "ignored" for kind in events]
        lines.append(f"| {state.name} | " + " | ".join(cells) + " |")
    lines += ["", "| state | guard (in priority order) | next state | on the way | timers |", "|---|---|---|---|---|"]
    for state, row in table.items():
        timers = ", ".join(name(t) for t in row.timers) or "—"
        for i, (guard, target, action) in enumerate(row.go):
            lines.append(
                f"| {state.name if i == 0 else ''} | {name(guard)} | {target.name} | {name(action)} | "
                f"{timers if i == 0 else ''} |"
            )
        if not row.go:
            lines.append(f"| {state.name} | — | — | — | {timers} |")
    return "\n".join(lines) + "\n"
