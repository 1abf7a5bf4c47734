"""Which parts of a GBNF grammar may become one llguidance lexeme without changing its language.

llguidance's lexer is greedy: while any allowed lexeme can still grow it keeps reading, and it
never splits a lexeme again. A regular piece X of a grammar is safe as one lexeme when
  (a) X cannot match the empty string,
  (b) no byte that can extend a complete match of X can start what follows X (EXTEND vs FOLLOW),
  (c) no other lexeme of the grammar starts with a byte X can start with (so X never swallows
      a competing path).
Everything else stays one lexeme per character, which is always exact. All sets here are
sets of first UTF-8 bytes, as 256-bit integers: the lexer decides byte by byte.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from .gbnf import AnyChar, Chars, Group, Literal, Node, Repeat, RuleRef, Rules, TokenRef

MAX_CODE_POINT = 0x10FFFF
MAX_POSITIONS = 4000  # bigger pieces stay per character: the automaton would cost too much
MAX_STATES = 4000
SPECIAL_TOKEN_BYTE = 1 << 0xFF  # llguidance marks special tokens with a 0xFF byte (never UTF-8)

Ranges = tuple[tuple[int, int], ...]


def node_ranges(node: Chars | AnyChar) -> Ranges:
    if isinstance(node, AnyChar):
        return ((0, MAX_CODE_POINT),)
    return _complement(node.ranges) if node.negated else tuple(sorted(node.ranges))


def _complement(ranges: Ranges) -> Ranges:
    result, next_low = [], 0
    for low, high in sorted(ranges):
        if low > next_low:
            result.append((next_low, low - 1))
        next_low = max(next_low, high + 1)
    if next_low <= MAX_CODE_POINT:
        result.append((next_low, MAX_CODE_POINT))
    return tuple(result)


def _lead_byte(code_point: int) -> int:
    return chr(code_point).encode("utf-8", "surrogatepass")[0]


def lead_bytes(ranges: Ranges) -> int:
    """The first bytes of the UTF-8 encodings of the code points (UTF-8 keeps their order)."""
    mask = 0
    for low, high in ranges:
        first, last = _lead_byte(low), _lead_byte(high)
        mask |= ((1 << (last + 1)) - 1) ^ ((1 << first) - 1)
    return mask


# -- FIRST / nullable / FOLLOW over the whole grammar ------------------------------------------


@dataclass
class GrammarSets:
    rules: Rules
    first: dict[str, int] = field(default_factory=dict)
    nullable: dict[str, bool] = field(default_factory=dict)
    follow: dict[str, int] = field(default_factory=dict)
    regular: set[str] = field(default_factory=set)

    def node_first(self, node: Node) -> int:
        if isinstance(node, (Chars, AnyChar)):
            return lead_bytes(node_ranges(node))
        if isinstance(node, Literal):
            return lead_bytes(((ord(node.text[0]),) * 2,)) if node.text else 0
        if isinstance(node, TokenRef):
            return SPECIAL_TOKEN_BYTE
        if isinstance(node, RuleRef):
            return self.first[node.name]
        if isinstance(node, Group):
            mask = 0
            for sequence in node.alternatives:
                mask |= self.sequence_first(sequence)
            return mask
        return self.node_first(node.node) if node.max != 0 else 0

    def node_nullable(self, node: Node) -> bool:
        if isinstance(node, Literal):
            return not node.text
        if isinstance(node, RuleRef):
            return self.nullable[node.name]
        if isinstance(node, Group):
            return any(self.sequence_nullable(sequence) for sequence in node.alternatives)
        if isinstance(node, Repeat):
            return node.min == 0 or self.node_nullable(node.node)
        return False

    def sequence_first(self, items: tuple[Node, ...]) -> int:
        mask = 0
        for item in items:
            mask |= self.node_first(item)
            if not self.node_nullable(item):
                break
        return mask

    def sequence_nullable(self, items: tuple[Node, ...]) -> bool:
        return all(self.node_nullable(item) for item in items)

    def follows_in_sequence(self, items: tuple[Node, ...], after: int) -> list[int]:
        """For each item: the first bytes of what may come right after it."""
        result = [0] * len(items)
        following = after
        for index in range(len(items) - 1, -1, -1):
            result[index] = following
            item = items[index]
            following = self.node_first(item) | (following if self.node_nullable(item) else 0)
        return result

    def is_regular(self, node: Node) -> bool:
        if isinstance(node, (Chars, AnyChar, Literal)):
            return True
        if isinstance(node, RuleRef):
            return node.name in self.regular
        if isinstance(node, Group):
            return all(self.is_regular(item) for seq in node.alternatives for item in seq)
        if isinstance(node, Repeat):
            return self.is_regular(node.node)
        return False


def analyse(rules: Rules) -> GrammarSets:
    sets = GrammarSets(rules)
    _fixpoint_first(sets)
    _fixpoint_follow(sets)
    sets.regular = _regular_rules(rules)
    return sets


def _fixpoint_first(sets: GrammarSets) -> None:
    for name in sets.rules:
        sets.first[name], sets.nullable[name] = 0, False
    changed = True
    while changed:
        changed = False
        for name, body in sets.rules.items():
            first, nullable = sets.node_first(body), sets.node_nullable(body)
            if (first, nullable) != (sets.first[name], sets.nullable[name]):
                sets.first[name], sets.nullable[name] = first, nullable
                changed = True


def _fixpoint_follow(sets: GrammarSets) -> None:
    sets.follow = {name: 0 for name in sets.rules}
    changed = True
    while changed:
        changed = False
        for name, body in sets.rules.items():
            for ref, after in _references_with_follow(sets, body, sets.follow[name]):
                if after & ~sets.follow[ref]:
                    sets.follow[ref] |= after
                    changed = True


def _references_with_follow(sets: GrammarSets, node: Node, after: int):
    if isinstance(node, RuleRef):
        yield node.name, after
    elif isinstance(node, Group):
        for sequence in node.alternatives:
            for item, item_after in zip(sequence, sets.follows_in_sequence(sequence, after)):
                yield from _references_with_follow(sets, item, item_after)
    elif isinstance(node, Repeat):
        yield from _references_with_follow(sets, node.node, repeat_follow(sets, node, after))


def repeat_follow(sets: GrammarSets, node: Repeat, after: int) -> int:
    """What may follow one round of a repetition: another round, or what follows it all."""
    again = node.max is None or node.max > 1
    return after | (sets.node_first(node.node) if again else 0)


def _regular_rules(rules: Rules) -> set[str]:
    """Rules without recursion or token references: they can be inlined into a regex."""
    state: dict[str, str] = {}

    def visit(name: str) -> bool:
        if state.get(name) == "visiting":
            return False
        if name in state:
            return state[name] == "regular"
        state[name] = "visiting"
        regular = _node_is_regular(rules[name], visit)
        state[name] = "regular" if regular else "not"
        return regular

    return {name for name in rules if visit(name)}


def _node_is_regular(node: Node, rule_is_regular) -> bool:
    if isinstance(node, TokenRef):
        return False
    if isinstance(node, RuleRef):
        return rule_is_regular(node.name)
    if isinstance(node, Group):
        return all(_node_is_regular(item, rule_is_regular) for seq in node.alternatives for item in seq)
    if isinstance(node, Repeat):
        return _node_is_regular(node.node, rule_is_regular)
    return True


# -- one candidate lexeme: its regex and the bytes that can extend a complete match -------------


class TooComplex(Exception):
    pass


@dataclass(frozen=True)
class _Fragment:
    nullable: bool
    first: frozenset[int]
    last: frozenset[int]


class PositionAutomaton:
    """Glushkov automaton of a regular piece: one position per character occurrence."""

    def __init__(self, rules: Rules):
        self.rules = rules
        self.chars: list[Ranges] = []
        self.follow: list[set[int]] = []

    def build(self, items: tuple[Node, ...]) -> _Fragment:
        return self._sequence([self._node(item) for item in items])

    def _node(self, node: Node) -> _Fragment:
        if isinstance(node, (Chars, AnyChar)):
            return self._position(node_ranges(node))
        if isinstance(node, Literal):
            return self._sequence([self._position(((ord(c), ord(c)),)) for c in node.text])
        if isinstance(node, RuleRef):
            return self._node(self.rules[node.name])
        if isinstance(node, Group):
            return self._alternatives([self.build(seq) for seq in node.alternatives])
        if isinstance(node, Repeat):
            return self._repeat(node)
        raise TooComplex("token references are not regular")

    def _repeat(self, node: Repeat) -> _Fragment:
        parts = [self._node(node.node) for _ in range(node.min)]
        if node.max is None:
            parts.append(self._star(self._node(node.node)))
        else:
            # (X?){k} has the language of X{0,k}
            parts += [self._optional(self._node(node.node)) for _ in range(node.max - node.min)]
        return self._sequence(parts)

    def _position(self, ranges: Ranges) -> _Fragment:
        if len(self.chars) >= MAX_POSITIONS:
            raise TooComplex("too many positions")
        self.chars.append(ranges)
        self.follow.append(set())
        position = frozenset((len(self.chars) - 1,))
        return _Fragment(False, position, position)

    def _sequence(self, parts: list[_Fragment]) -> _Fragment:
        result = _Fragment(True, frozenset(), frozenset())
        for part in parts:
            for position in result.last:
                self.follow[position].update(part.first)
            result = _Fragment(
                result.nullable and part.nullable,
                result.first | part.first if result.nullable else result.first,
                part.last | result.last if part.nullable else part.last,
            )
        return result

    def _alternatives(self, parts: list[_Fragment]) -> _Fragment:
        return _Fragment(
            any(p.nullable for p in parts),
            frozenset().union(*(p.first for p in parts)),
            frozenset().union(*(p.last for p in parts)),
        )

    def _star(self, part: _Fragment) -> _Fragment:
        for position in part.last:
            self.follow[position].update(part.first)
        return _Fragment(True, part.first, part.last)

    def _optional(self, part: _Fragment) -> _Fragment:
        return _Fragment(True, part.first, part.last)


def extension_bytes(rules: Rules, items: tuple[Node, ...]) -> tuple[bool, int]:
    """(nullable, first bytes of every character that can extend a complete match)."""
    automaton = PositionAutomaton(rules)
    whole = automaton.build(items)
    boundaries = sorted({b for ranges in automaton.chars for low, high in ranges for b in (low, high + 1)})
    covers = [_covered_intervals(ranges, boundaries) for ranges in automaton.chars]
    extension: set[int] = set()
    start = frozenset([-1])
    seen, todo = {start}, [start]
    while todo:
        state = todo.pop()
        moves = _moves(state, whole.first, automaton.follow, covers)
        if state & whole.last or (state == start and whole.nullable):
            extension.update(moves)
        for target in set(map(frozenset, moves.values())):
            if target not in seen:
                if len(seen) >= MAX_STATES:
                    raise TooComplex("too many states")
                seen.add(target)
                todo.append(target)
    intervals = tuple((boundaries[i], boundaries[i + 1] - 1) for i in sorted(extension))
    return whole.nullable, lead_bytes(intervals)


def _covered_intervals(ranges: Ranges, boundaries: list[int]) -> list[int]:
    covered = []
    for low, high in ranges:
        first = bisect.bisect_left(boundaries, low)
        last = bisect.bisect_left(boundaries, high + 1)
        covered.extend(range(first, last))
    return covered


def _moves(state, first, follow, covers) -> dict[int, set[int]]:
    targets = first if -1 in state else set().union(*(follow[p] for p in state))
    moves: dict[int, set[int]] = {}
    for position in targets:
        for interval in covers[position]:
            moves.setdefault(interval, set()).add(position)
    return moves
