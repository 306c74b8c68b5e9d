"""What a RASP ``Select`` computes, and the head role it is: the table compiled truth is read with.

:func:`relation_of` evaluates a predicate (a ``Comparison`` or a library lambda such as
``shift_by``'s ``q == k + offset``) on every (key, query) pair of the value sets the compiler
inferred and names the relation it is. :func:`role_of` maps (key s-op, query s-op, relation,
causal) to a role by :data:`ROLE_TABLE`; everything not listed there is ``"none"``.
:data:`VERDICT_ROLES` says which headscope verdict rows claim each role (a role with none has no
detector here, and its recall is not measured).

>>> relation_of(lambda k, q: q == k + 1, [0, 1, 2], [0, 1, 2])
'k == q - 1'
>>> role_of("indices", "indices", "k == q - 1", causal=True), role_of("tokens", "indices", "k == q", causal=False)
('previous-token', 'none')
"""

from __future__ import annotations

#: (keys, queries, relation, causal or None for either) -> role; the first match wins, "none" otherwise.
#: ``*`` matches any s-op. Roles are patterns of attention: previous-token (each query on the key one
#: position back, the first on BOS), duplicate-token (on the keys holding the query's token, itself
#: included), uniform (equal weight on every key it sees) and sink (on BOS alone).
ROLE_TABLE = (
    ("indices", "indices", "k == q - 1", None, "previous-token"),
    ("tokens", "tokens", "k == q", None, "duplicate-token"),
    ("*", "*", "all", None, "uniform"),
    ("indices", "indices", "k <= q", True, "uniform"),
    ("*", "*", "none", None, "sink"),
)
#: the roles of :data:`ROLE_TABLE`, and "none"
ROLES = ("previous-token", "duplicate-token", "uniform", "sink", "none")
#: role -> the headscope verdict rows (``role`` column of the roles frame) that claim it
VERDICT_ROLES = {
    "previous-token": ("previous-token", "positional:previous"),
    "duplicate-token": ("duplicate-token",),
    "sink": ("sink:first-token",),
    "uniform": (),
}


def _matrix(pred, keys, queries):
    try:
        return [[bool(pred(k, q)) for k in keys] for q in queries]
    except (TypeError, ValueError):
        return None


def relation_of(pred, keys: list, queries: list) -> str:
    """The relation ``pred(key, query)`` computes over ``keys`` × ``queries``: ``"all"``, ``"none"``,
    ``"k == q - d"`` (integers; ``"k == q"`` for d = 0, also for any values), ``"k <= q"``,
    ``"k < q"``, or ``"other"``."""
    m = _matrix(pred, keys, queries)
    if m is None or not keys or not queries:
        return "other"
    flat = [x for row in m for x in row]
    if all(flat):
        return "all"
    if not any(flat):
        return "none"

    def same(fn) -> bool:
        try:
            return all(m[i][j] == bool(fn(k, q)) for i, q in enumerate(queries) for j, k in enumerate(keys))
        except TypeError:
            return False

    if same(lambda k, q: k == q):
        return "k == q"
    if all(isinstance(v, int) and not isinstance(v, bool) for v in (*keys, *queries)):
        for d in range(1, len(queries) + len(keys)):
            if same(lambda k, q, d=d: k == q - d):
                return f"k == q - {d}"
        if same(lambda k, q: k <= q):
            return "k <= q"
        if same(lambda k, q: k < q):
            return "k < q"
    return "other"


def role_of(keys: str, queries: str, relation: str, *, causal: bool) -> str:
    """The role of a head whose Select has these ``keys`` and ``queries`` s-ops (labels) and
    ``relation`` (:func:`relation_of`) in a ``causal`` model, by :data:`ROLE_TABLE`."""
    for k, q, rel, cause, role in ROLE_TABLE:
        if k in ("*", keys) and q in ("*", queries) and rel == relation and cause in (None, causal):
            return role
    return "none"
