"""Hypothesis strategies shared by test modules."""

from __future__ import annotations

from hypothesis import strategies as st

from gateway.wire import protocol as p
from gateway.wire.protocol import COMMANDS, Wire


def _fits(text: str) -> bool:
    return len(text.encode()) <= 255


STRING = st.one_of(
    st.text(max_size=40),
    st.text(max_size=255).filter(_fits),
    st.text(alphabet="ab", min_size=250, max_size=255),
    st.sampled_from(["", "a" * 255, "\u00e9" * 127 + "a", "\U0001f600" * 63 + "abc"]),
)


SIZES = {Wire.NUMBER_2: 2, Wire.NUMBER_4: 4, Wire.NUMBER_8: 8}


WIRE = {
    **{w: st.integers(0, 256**n - 1) | st.sampled_from([0, 256**n - 1]) for w, n in SIZES.items()},
    Wire.STRING: STRING,
    Wire.STRINGS: st.lists(STRING, max_size=6).map(tuple),
    Wire.CHUNK: st.binary(max_size=300) | st.sampled_from([b"", b"\0" * 70_000]),
}


def _command(spec: p.CommandSpec) -> st.SearchStrategy[p.Command]:
    fields = {n: (st.just(p.PROTOCOL) if n == "protocol" else WIRE[w]) for n, w in spec.fields}
    return st.fixed_dictionaries(fields).map(lambda kw: spec.cls(**kw))


COMMAND = st.sampled_from(list(COMMANDS.values())).flatmap(_command)
