"""Planning: a pure function from (graph, number of ranks) to one plan per rank.

No MPI, no clock: the same graph and rank count always give the same plan, the same
tags and so the same numbers. Every rank computes the plan itself (or receives it),
so a receiver knows the source, tag, shape and dtype of every message in advance and
can post its receive into a buffer of the right size; no control messages are needed.

What the plan decides:

placement   tasks that write a tile run on its owner (owner computes); a task writing
            data of several owners runs on the one that moves the fewest bytes
            (:func:`writer_rank`); other tasks follow their inputs
            (:mod:`taskgraph.dsl.placement`). Plain data have a home rank from
            :func:`taskgraph.plan.homes.choose_homes`.
priority    the task's bottom level: the heaviest (by flops) path from it to the end
            of the graph, so the critical path runs first.
messages    for every version of data read on a rank other than where it was made,
            one message from the holder to that rank, however many tasks read it::

               producer (rank a) --tile/value, tag--> consumers (rank b)

            A writer that overwrites a tile whose old version is being sent elsewhere
            waits for those sends to complete (its cross-rank write-after-read edges).
            Any other edge between ranks (an explicit dependency) becomes a 0-byte
            signal message. A version written away from its data's owner goes home
            (a ``home`` message, received into the owner's storage) when a task on
            the owner reads or overwrites it, or when it is the data's last::

               writer (rank a, foreign tile) --tile, home--> owner's storage (rank b)
tags        per (source, destination) pair, numbered from 1 in plan order; tag 0 is
            kept for the runtime's own control messages.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..core.errors import PlanError
from ..dsl.graph import Graph
from ..dsl.placement import pick_rank
from ..dsl.tasks import INITIAL, paused_gc
from .homes import choose_homes

CONTROL_TAG = 0


@dataclass(slots=True)
class Message:
    """One planned transfer of one version of data between two ranks."""

    src: int
    dst: int
    kind: str  # "tile", "value" or "signal"
    data: int  # data id (the producing task for signals)
    producer: int  # task whose output this is, INITIAL for data before the run
    nbytes: int = 0
    shape: tuple | None = None
    dtype: str | np.dtype | None = None  # (see wire_dtype)
    tag: int = 0
    consumers: list[int] = field(default_factory=list)  # tasks on dst waiting for it, once each
    release: list[int] = field(default_factory=list)  # tasks on src waiting for the send
    home: bool = False  # a version made elsewhere, received into the owner's storage
    order: str = "F"  # a tile's layout; "C" for a plain C-ordered array of 2+ dimensions


@dataclass
class RankPlan:
    """What one rank does: its tasks, their counters, and its messages.

    ``rank`` of ``size`` ranks; ``tasks``: its tasks in a topological order;
    ``priority``: each task's bottom level; ``waits``: the events each task waits for
    before it is ready (local predecessors and messages); ``successors``: the local
    tasks to count down when a task ends; ``sends``: the messages each producing task
    sends (key INITIAL: sent at the start); ``recvs``: incoming messages, in the order
    they are likely needed; ``results``: tasks whose values every rank gets at the end;
    ``homes``: the home rank of each plain datum; ``foreign``: the tasks here that
    write data owned by another rank, with the ((data, previous producer), ...) they
    write.
    """

    rank: int
    size: int
    tasks: list[int]  # this rank's tasks, in topological order
    priority: dict[int, float]
    waits: dict[int, int]  # events each task waits for before it is ready
    successors: dict[int, list[int]]  # local tasks to notify when a task ends
    sends: dict[int, list[Message]]  # by producing task; INITIAL: sent at the start
    recvs: list[Message]  # incoming messages, in the order they are likely needed
    results: list[int]  # tasks whose values every rank gets at the end
    homes: dict[int, int] = field(default_factory=dict)  # plain data -> its home rank
    foreign: dict[int, tuple] = field(default_factory=dict)  # task -> data it writes elsewhere


@dataclass
class Plan:
    """The plan of ``graph`` on ``nranks`` ranks (made by :func:`make_plan`):
    ``placement`` (the rank of each task), ``priority`` (each task's bottom level),
    the cross-rank ``messages``, tagged, and ``owner_of`` (each datum's rank before the
    run: a tile's owner, a plain datum's home). :meth:`for_rank` extracts one rank's part."""

    graph: Graph
    nranks: int
    placement: list[int]
    priority: list[float]
    messages: list[Message]
    owner_of: list[int] = field(default_factory=list)  # each datum's rank before the run

    def for_rank(self, rank: int) -> RankPlan:
        """The part of the plan that rank ``rank`` carries out (:class:`RankPlan`)."""
        return rank_plan(self, rank)

    def tasks_per_rank(self) -> list[int]:
        """How many tasks each rank runs, by rank."""
        counts = [0] * self.nranks
        for r in self.placement:
            counts[r] += 1
        return counts

    def traffic(self) -> np.ndarray:
        """Bytes planned from each rank (row) to each rank (column)."""
        m = np.zeros((self.nranks, self.nranks), np.int64)
        for msg in self.messages:
            m[msg.src, msg.dst] += msg.nbytes
        return m


def make_plan(graph: Graph, nranks: int, owner: Callable | None = None) -> Plan:
    """Place, prioritise and list the messages of ``graph`` on ``nranks`` ranks.

    ``owner(tile) -> rank`` overrides where tiles live (for what-if plans such as
    :meth:`Graph.preview` at another rank count); by default each matrix's own
    distribution decides.
    """
    with paused_gc():  # many small acyclic objects: see Graph.__enter__
        try:
            return _make_plan(graph, nranks, owner)
        finally:
            graph.drop_caches()  # ~100 bytes a task that the plan no longer needs


def _make_plan(graph: Graph, nranks: int, owner: Callable | None) -> Plan:
    graph.check()  # a cycle raises here, naming its tasks
    if owner is None:
        _check_matrices(graph, nranks)
    owner_of = data_owners(graph, owner, nranks)
    if any(o >= nranks for o in owner_of):
        raise PlanError(f"a tile owner lies outside the {nranks} ranks of the plan")
    placement = place(graph, nranks, owner_of)
    priority = graph.bottom_levels()
    messages = plan_messages(graph, placement, owner_of)
    assign_tags(messages)
    return Plan(graph, nranks, placement, priority, messages, owner_of)


def _check_matrices(graph: Graph, nranks: int) -> None:
    for m in graph.matrices():
        if m.nranks != nranks:
            raise PlanError(
                f"matrix {m.name} is distributed over {m.nranks} ranks, but the run has {nranks}"
            )


def data_owners(graph: Graph, owner: Callable | None = None, nranks: int = 1) -> list[int]:
    """The rank holding each datum before the run: its tile's owner (``owner(tile)``
    if given), the home of plain data (:func:`~taskgraph.plan.homes.choose_homes` over
    ``nranks`` ranks), -1 for values."""
    data = graph.data
    if owner is None:
        owners = [d.tile.owner if d.tile is not None else -1 for d in data]
    else:
        owners = [int(owner(d.tile)) if d.tile is not None else -1 for d in data]
    plain = [i for i, d in enumerate(data) if d.item is not None]
    if plain:
        items = [data[i].item for i in plain]
        homes = choose_homes(
            [it.nbytes for it in items if it is not None],
            [it.rank for it in items if it is not None],
            nranks,
            [it.name for it in items if it is not None],
        )
        for i, home in zip(plain, homes, strict=True):
            owners[i] = home
    return owners


def writer_rank(
    candidates: list[int], inputs: list[tuple[int, int]], outputs: list[tuple[int, int]]
) -> int:
    """The rank among ``candidates`` (the owners of the data a task writes) where the
    task moves the fewest bytes: ``inputs`` (source rank, bytes) of what it reads,
    ``outputs`` (home rank, bytes) of what it writes. Ties go to the lowest rank."""

    def moved(r: int) -> int:
        return sum(n for src, n in inputs if src != r) + sum(n for h, n in outputs if h != r)

    return min(candidates, key=lambda r: (moved(r), r))


def place(graph: Graph, nranks: int, owner_of: list[int] | None = None) -> list[int]:
    """Owner computes for tile writers (a task writing data of several owners runs on
    one of them, :func:`writer_rank`); the others follow their inputs, in task order."""
    placement = [0] * len(graph.tasks)
    load = [0.0] * nranks
    data = graph.data
    if owner_of is None:
        owner_of = data_owners(graph, None, nranks)
    nbytes_of = [d.nbytes for d in data]
    for t in graph.tasks:
        rank = -1
        for d, _ in t.writes:
            o = owner_of[d]
            if o < 0:
                continue
            if rank >= 0 and o != rank:
                rank = _several_owners(graph, t, placement, owner_of, nbytes_of)
                break
            rank = o
        if rank < 0:
            reads = t.reads
            if len(reads) == 1:  # one input: go where it is
                d, prod = reads[0]
                rank = placement[prod] if prod != INITIAL else owner_of[d]
            else:
                where: dict[int, float] = {}
                for d, prod in reads:
                    r = placement[prod] if prod != INITIAL else owner_of[d]
                    where[r] = where.get(r, 0.0) + nbytes_of[d]
                rank = pick_rank(where, load)
        load[rank] += 1.0
        placement[t.id] = rank
    return placement


def _several_owners(
    graph: Graph, t, placement: list[int], owner_of: list[int], nbytes_of: list[int]
) -> int:
    """The rank of task t, which writes data of several owners."""
    data = graph.data
    for d, _ in t.writes:
        if owner_of[d] >= 0 and data[d].tile is None and not _is_array(data[d]):
            raise PlanError(
                f"task {graph.label(t.id)} writes the object {data[d].label()} (home rank "
                f"{owner_of[d]}) and data of other ranks: only arrays can be written away "
                "from their home; pin them to one rank"
            )
    candidates = sorted({owner_of[d] for d, _ in t.writes if owner_of[d] >= 0})
    inputs = [
        (placement[prod] if prod != INITIAL else owner_of[d], nbytes_of[d]) for d, prod in t.reads
    ]
    outputs = [(owner_of[d], nbytes_of[d]) for d, _ in t.writes if owner_of[d] >= 0]
    return writer_rank(candidates, inputs, outputs)


def _is_array(datum) -> bool:
    return datum.item is not None and bool(datum.item.is_array)


def plan_messages(
    graph: Graph, placement: list[int], owner_of: list[int] | None = None
) -> list[Message]:
    """Every cross-rank transfer the graph needs, in a deterministic order."""
    if owner_of is None:
        owner_of = data_owners(graph, None, max(placement, default=0) + 1)
    messages: list[Message] = []
    by_key: dict[tuple, Message] = {}
    by_version: dict[tuple[int, int], list[Message]] = {}
    sent: set[int] = set()  # data with a version in by_version (a cheap first test)
    no_release: list[int] = []
    last: dict[int, int] = {}  # data written away from its owner -> its latest writer

    def version_message(d: int, prod: int, src: int, dst: int) -> Message:
        key = (d, prod, dst)
        msg = by_key.get(key)
        if msg is None:
            msg = by_key[key] = _data_message(graph, src, dst, d, prod, owner_of)
            by_version.setdefault((d, prod), []).append(msg)
            sent.add(d)
            messages.append(msg)
        return msg

    for t in graph.tasks:
        tid = t.id
        rank = placement[tid]
        reads = t.reads
        for d, prod in reads:
            src = placement[prod] if prod != INITIAL else owner_of[d]
            if src == rank:
                continue
            msg = version_message(d, prod, src, rank)
            if not msg.consumers or msg.consumers[-1] != tid:  # once per task
                msg.consumers.append(tid)
        released = no_release  # tasks t waits for through the sends it releases
        for d, prev in t.writes:
            if d in last or owner_of[d] not in (rank, -1):
                if prev != INITIAL and placement[prev] != rank and owner_of[d] == rank:
                    # the owner overwrites a version made elsewhere: it waits for it
                    msg = version_message(d, prev, placement[prev], rank)
                    if tid not in msg.consumers:
                        msg.consumers.append(tid)
                    released = released + [prev]
                last[d] = tid
            if d not in sent:
                continue
            for msg in by_version.get((d, prev), ()):
                if msg.src == rank:  # the old version leaves from the buffer t overwrites
                    msg.release.append(tid)
                    released = released + msg.consumers
        for p in t.preds:
            if placement[p] == rank:
                continue
            for _, q in reads:  # (loops, not a set: most tasks read one or two versions)
                if q == p:
                    break  # p's output comes in a message t waits for
            else:
                if p in released:
                    continue  # t waits for the message whose send it releases
                key = ("signal", p, rank)
                signal = by_key.get(key)
                if signal is None:
                    signal = by_key[key] = Message(placement[p], rank, "signal", p, p)
                    messages.append(signal)
                if tid not in signal.consumers:
                    signal.consumers.append(tid)
    for d, w in last.items():  # the last version of data written away goes home
        if placement[w] != owner_of[d]:
            version_message(d, w, placement[w], owner_of[d])
    return messages


def wire_dtype(dtype: np.dtype):
    """A message's dtype: its string (cheap to pickle and compare), or the dtype itself
    where a string loses its fields (structured dtypes)."""
    return dtype if dtype.fields else dtype.str


def _data_message(
    graph: Graph, src: int, dst: int, d: int, prod: int, owner_of: list[int]
) -> Message:
    item = graph.data[d]
    home = dst == owner_of[d]  # made away from its owner: lands in the owner's storage
    if item.tile is not None:
        tile = item.tile
        shape, dtype = tile.shape, wire_dtype(tile.dtype)
        return Message(src, dst, "tile", d, prod, item.nbytes, shape, dtype, home=home)
    plain = item.item
    if plain is not None and plain.is_array:
        assert plain.shape is not None and plain.dtype is not None
        shape, dtype = tuple(plain.shape), wire_dtype(plain.dtype)
        order = "F" if plain.value.flags.f_contiguous else "C"  # (received as it is sent)
        msg = Message(src, dst, "tile", d, prod, plain.nbytes, shape, dtype, home=home)
        msg.order = order
        return msg
    return Message(src, dst, "value", d, prod, item.nbytes)


def assign_tags(messages: list[Message]) -> None:
    """Number the messages of each (source, destination) pair 1, 2, 3, ... in order."""
    seq: dict[tuple[int, int], int] = {}
    for msg in messages:
        pair = (msg.src, msg.dst)
        seq[pair] = seq.get(pair, 0) + 1
        msg.tag = seq[pair]


def rank_plan(plan: Plan, rank: int) -> RankPlan:
    """Extract what ``rank`` needs from the global plan."""
    with paused_gc():
        return _rank_plan(plan, rank)


def _rank_plan(plan: Plan, rank: int) -> RankPlan:
    graph, placement = plan.graph, plan.placement
    tasks = [t for t in graph.order() if placement[t] == rank]
    waits = {t: 0 for t in tasks}
    successors: dict[int, list[int]] = {t: [] for t in tasks}
    for t in tasks:
        for p in graph.tasks[t].preds:
            if placement[p] == rank:
                waits[t] += 1
                successors[p].append(t)
    sends: dict[int, list[Message]] = {}
    recvs: list[Message] = []
    for msg in plan.messages:
        if msg.src == rank:
            sends.setdefault(msg.producer, []).append(msg)
            for t in msg.release:
                waits[t] += 1
        if msg.dst == rank:
            recvs.append(msg)
            for t in msg.consumers:
                waits[t] += 1
    results: list[int] = []
    if graph.has_values:  # values of @tg.task calls that no other task uses
        used = {p for t in graph.tasks for p in t.preds}
        results = [t.id for t in graph.tasks if t.id not in used and not hasattr(t.fn, "modes")]
    priority = {t: plan.priority[t] for t in tasks}
    owner_of = plan.owner_of
    homes = {d: owner_of[d] for d, item in enumerate(graph.data) if item.item is not None}
    foreign: dict[int, tuple] = {}
    if owner_of:
        for t in tasks:
            away = tuple((d, p) for d, p in graph.tasks[t].writes if owner_of[d] not in (rank, -1))
            if away:
                foreign[t] = away
    return RankPlan(
        rank, plan.nranks, tasks, priority, waits, successors, sends, recvs, results, homes, foreign
    )
