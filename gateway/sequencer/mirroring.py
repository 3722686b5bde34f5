"""Who may write a stream that may be a mirror of another site's (docs/mirroring.md): the gateway's rules, sans-IO.

Rules
=====

1. A stream is PRIMARY (an ordinary stream: its publishers sequence it), MIRROR (`zeps gateway --mirror S`: a
   copy of another site's stream, written only by a mirror session, `zeps mirror`), PROMOTING (a promotion asked
   for and not yet persisted) or PROMOTED (a mirror made the primary by `zeps mirror promote`; it stays so across
   restarts and failovers, by the promotion mark).
2. A MIRROR accepts a mirror batch only if it starts right after its journal's head (first == head + 1), so
   the source's sequences are kept and two mirrors can never interleave or repeat a record: the second one's
   batch is refused naming both numbers, and it resumes from the head it is told.
3. A MIRROR refuses every ordinary publisher (PUBLISH, PUBLISH-BATCH, plain PUB) naming the two ways out:
   publish at the source, or promote this site.
4. Promotion happens once the mark is persisted: PROMOTE in MIRROR asks the shell to persist it at the head
   (`Persist`: a single gateway writes its file; a node of a group makes it the group's first, fenced by its
   epoch) and waits in PROMOTING, where nothing writes the stream (so the head it was promoted at stays the
   head) and every writer is told to retry later. `Promoted` (the shell persisted it) moves the stream to
   PROMOTED; `NotPromoted` (it could not) back to MIRROR, the asker told why. A PROMOTE in PROMOTED answers
   with the sequence it was promoted at (promoting twice is harmless).
5. A PROMOTED stream takes publishers (sequences continue from the head it was promoted at) and never a mirror
   batch again, nor tells a mirror where to resume: the fence between the old source and the new primary.
6. A MIRROR also takes `Promoted` without asking: a node of a group that starts to lead learns so that the group
   was promoted under an earlier leader (docs/mirroring.md, "Promoting a group").
7. A PRIMARY stream refuses mirror sessions and promotion, naming --mirror; it accepts publishers (the shell
   skips this machine for them: the publish path is hot and the answer never changes).
8. Nothing here does I/O or reads a clock; the shell (gateway.sequencer.gateway) journals, persists and answers.

Theory of operation
===================

The gateway keeps one `MirrorRules` per stream and feeds it an event per command that writes the stream;
`on(event)` returns the verdict: `Accept`, `Resume(head)` (MIRROR-OK), `Persist(head)` (persist the promotion
mark, then feed `Promoted` or `NotPromoted`), `PromotedAt(head)` (PROMOTE-OK) or `Refuse(reason)` (INVALID).
Every state's handlers and transitions are in TRANSITIONS, in the table form of gateway.machine;
`describe_transitions()` renders it for docs/mirroring.md and a test keeps the two equal.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from gateway import machine
from gateway.wire import announce as A
from gateway.wire.reasons import retry_later


class Role(enum.Enum):
    PRIMARY = "primary"
    MIRROR = "mirror"
    PROMOTING = "promoting"
    PROMOTED = "promoted"

    @property
    def copy(self) -> str:
        """The copy a gateway announces holding (gateway.wire.announce.COPIES): a promotion not persisted yet
        is still a mirror."""
        return A.MIRROR if self is Role.PROMOTING else self.value


# --- events -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hello:
    """A mirror session asks where to resume (MIRROR); `head`: the stream's journal head."""

    head: int


@dataclass(frozen=True, slots=True)
class MirrorBatch:
    """A mirror session's batch of the source's records from `first` on; `head`: the journal head."""

    first: int
    head: int


@dataclass(frozen=True, slots=True)
class PublisherBatch:
    """An ordinary publisher's records (PUBLISH, PUBLISH-BATCH, plain PUB)."""


@dataclass(frozen=True, slots=True)
class Promote:
    """PROMOTE, at journal head `head`."""

    head: int


@dataclass(frozen=True, slots=True)
class Promoted:
    """The promotion at `head` is persisted (asked for here, or learnt from the group on taking the lead)."""

    head: int


@dataclass(frozen=True, slots=True)
class NotPromoted:
    """The shell could not persist the promotion asked for, for `reason`."""

    reason: str


EVENT_KINDS = (Hello, MirrorBatch, PublisherBatch, Promote, Promoted, NotPromoted)
Event = Hello | MirrorBatch | PublisherBatch | Promote | Promoted | NotPromoted

# --- verdicts ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Accept:
    """Journal it (a mirror batch: verbatim, its sequences kept)."""


@dataclass(frozen=True, slots=True)
class Resume:
    """MIRROR-OK(head): the next mirror batch must start at head + 1."""

    head: int


@dataclass(frozen=True, slots=True)
class Persist:
    """Persist the promotion mark at `head`, then feed Promoted(head), or NotPromoted(why) if it cannot."""

    head: int


@dataclass(frozen=True, slots=True)
class PromotedAt:
    """PROMOTE-OK(head)."""

    head: int


@dataclass(frozen=True, slots=True)
class Refuse:
    """INVALID(reason)."""

    reason: str


Verdict = Accept | Resume | Persist | PromotedAt | Refuse


class MirrorRules:
    """One stream's rules (the module docstring). Its table is TRANSITIONS."""

    def __init__(self, stream: str, role: Role, promoted_at: int | None = None) -> None:
        """`promoted_at`: the promotion mark's sequence, for a stream starting PROMOTED."""
        if (role is Role.PROMOTED) != (promoted_at is not None):
            raise ValueError("a PROMOTED stream needs the sequence it was promoted at, and only it")
        self.stream = stream
        self.role = role
        self.promoted_at = promoted_at
        self.persisting: int | None = None  # PROMOTING: the head the promotion asked for is to be persisted at
        self.verdict: Verdict = Accept()

    def on(self, event: Event) -> Verdict:
        """Run one event through the table; the verdict for the shell to carry out."""
        self.verdict = Refuse(f"{type(event).__name__} means nothing to stream {self.stream!r} as {self.role.name}")
        self.role = machine.settle(self, TRANSITIONS, self.role, event)
        return self.verdict

    # --- handlers (they set the verdict, never the role) -------------------------------------------------

    def _resume(self, event: Hello) -> None:
        self.verdict = Resume(event.head)

    def _check_contiguous(self, event: MirrorBatch) -> None:
        if event.first == event.head + 1:
            self.verdict = Accept()
        else:
            self.verdict = Refuse(
                f"not contiguous: this mirror's head is {event.head}, the batch starts at {event.first}; "
                f"resume from {event.head + 1}"
            )

    def _refuse_publisher(self, event: PublisherBatch) -> None:
        self.verdict = Refuse(
            f"stream {self.stream} is a mirror of another site: publish at the source, or promote this site with "
            f"`zeps mirror promote --stream {self.stream}`"
        )

    def _accept(self, event: PublisherBatch) -> None:
        self.verdict = Accept()

    def _persist(self, event: Promote) -> None:
        self.persisting = event.head
        self.verdict = Persist(event.head)

    def _take_promotion(self, event: Promoted) -> None:
        self.promoted_at, self.persisting = event.head, None
        self.verdict = PromotedAt(event.head)

    def _not_promoted(self, event: NotPromoted) -> None:
        self.persisting = None
        self.verdict = Refuse(f"the promotion could not be persisted ({event.reason}): stream {self.stream} is still a "
                              "mirror")  # fmt: skip

    def _promoting(self, event: Hello | MirrorBatch | PublisherBatch | Promote) -> None:
        self.verdict = Refuse(
            retry_later(f"stream {self.stream} is being promoted at sequence {self.persisting} at this site")
        )

    def _promoted_already(self, event: Promote | Promoted) -> None:
        assert self.promoted_at is not None
        self.verdict = PromotedAt(self.promoted_at)

    def _fenced(self, event: Hello | MirrorBatch) -> None:
        self.verdict = Refuse(
            f"this site was promoted at sequence {self.promoted_at}; it no longer accepts mirror batches"
        )

    def _not_a_mirror(self, event: Hello | MirrorBatch | Promote) -> None:
        self.verdict = Refuse(
            f"stream {self.stream} is not a mirror at this gateway: start the gateway with --mirror {self.stream} "
            "to make it one"
        )

    # --- guards -----------------------------------------------------------------------------------------

    def _persisted(self) -> bool:
        return self.promoted_at is not None

    def _asked(self) -> bool:
        return self.persisting is not None

    def _given_up(self) -> bool:
        return self.persisting is None and self.promoted_at is None


Go = machine.Go[MirrorRules, Role]
Row = machine.Row[MirrorRules, Role]
M = MirrorRules

TRANSITIONS: dict[Role, Row] = {
    Role.PRIMARY: Row(
        on={Hello: M._not_a_mirror, MirrorBatch: M._not_a_mirror, PublisherBatch: M._accept, Promote: M._not_a_mirror},
    ),
    Role.MIRROR: Row(
        on={
            Hello: M._resume,
            MirrorBatch: M._check_contiguous,
            PublisherBatch: M._refuse_publisher,
            Promote: M._persist,
            Promoted: M._take_promotion,
        },
        go=(Go(M._persisted, Role.PROMOTED), Go(M._asked, Role.PROMOTING)),
    ),
    Role.PROMOTING: Row(
        on={
            **dict.fromkeys((Hello, MirrorBatch, PublisherBatch, Promote), M._promoting),  # every writer waits
            Promoted: M._take_promotion,
            NotPromoted: M._not_promoted,
        },
        go=(Go(M._persisted, Role.PROMOTED), Go(M._given_up, Role.MIRROR)),
    ),
    Role.PROMOTED: Row(
        on={
            Hello: M._fenced,
            MirrorBatch: M._fenced,
            PublisherBatch: M._accept,
            Promote: M._promoted_already,
            Promoted: M._promoted_already,
        },
    ),
}
del M


def describe_transitions() -> str:
    """TRANSITIONS as Markdown (docs/mirroring.md embeds it; a test keeps them equal)."""
    return machine.describe(TRANSITIONS, EVENT_KINDS)
