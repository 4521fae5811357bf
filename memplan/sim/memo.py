"""Reuse a deterministic computation while the answers it depended on are the same.

Search planners simulate thousands of plans that differ in a few decisions. Much of the
work for one plan (a recompute chain, whether a lineage can be rebuilt) reads only a few
facts about the rest of the plan: "is storage r resident at op t?". `ProbeMemo` stores
such a result under a key together with the questions (probes) the computation asked
and the answers it got, as a trie: the first question asked for a key is always the
same one, and each answer determines the next question, so a lookup asks exactly the
questions the computation would ask, in the same order, and returns its result when
every answer matches a recorded path. The result is then the one the computation would
compute, as long as it is deterministic given its key and the answers.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

MISS = object()  # what `lookup` returns when the computation has to run
DEFAULT_LIMIT = 200_000  # nodes kept before the memo starts over (bounds its memory)


class _Node:
    __slots__ = ("children", "item", "value", "usual")

    def __init__(self):
        self.item = MISS  # the probe asked here (MISS at a leaf)
        self.children: dict = {}  # answer -> next node
        self.value = MISS  # the result (at a leaf)
        # the owner's: the child its usual answer here leads to, once recorded (an answer that follows from
        # facts that never change, found without asking: nodes are never removed but all at once)
        self.usual = None


class ProbeMemo:
    """Results by key and by the answers to the probes the computation made."""

    def __init__(self, limit: int = DEFAULT_LIMIT):
        self.limit = limit
        self.roots: dict[Hashable, _Node] = {}
        self.nodes = 0
        self.facts: dict = {}  # for the owner's probes: answers that never change (e.g. lifetimes at an op)

    def lookup(self, key: Hashable, probe: Callable[[Hashable], Hashable]):
        """The stored result for `key` whose recorded answers `probe` reproduces, else MISS."""
        node = self.roots.get(key)
        while node is not None:
            if node.item is MISS:
                return node.value
            node = node.children.get(probe(node.item))
        return MISS

    def compute(self, key: Hashable, probe: Callable[[Hashable], Hashable], fn: Callable):
        """`fn(probe)`, from the memo when possible; `fn` must ask everything it depends on through `probe`."""
        value = self.lookup(key, probe)
        return self.record(key, probe, fn) if value is MISS else value

    def record(self, key: Hashable, probe: Callable[[Hashable], Hashable], fn: Callable):
        """`fn(probe)` computed and stored under `key` and the answers it got: `compute` once `lookup`
        missed (for a caller that makes `fn` only on a miss)."""
        asked: list = []

        def recording(item):
            answer = probe(item)
            asked.append((item, answer))
            return answer

        value = fn(recording)
        self._insert(key, asked, value)
        return value

    def _insert(self, key: Hashable, asked: list, value) -> None:
        if self.nodes >= self.limit:
            self.roots.clear()
            self.nodes = 0
        node = self.roots.get(key)
        if node is None:
            node = self.roots[key] = _Node()
            self.nodes += 1
        for item, answer in asked:
            node.item = item
            child = node.children.get(answer)
            if child is None:
                child = node.children[answer] = _Node()
                self.nodes += 1
            node = child
        node.value = value
