"""In-context-learning tasks written by this project (no external data set), for the function-vector
role (:mod:`.function_vector`, Todd et al. 2024) and its SmolLM2 study.

Each task is a list of ``(input, output)`` word pairs (:data:`TASKS`): antonyms, country → capital,
capitalisation (``apple`` → ``Apple``), next letter, English → French, present → past tense. A
prompt is Todd et al.'s format: demonstrations ``"Q: x\\nA: y\\n\\n"`` then the query ``"Q: x\\nA:"``
(:data:`TEMPLATE`); the answer is read as the **first token of** ``" y"`` (as Todd et al. do). A pair
takes part only where that first token is known (not the unknown token), is no other output's first
token in the task (so that it names the answer), and the input has no unknown token:
:func:`usable_pairs` keeps those and counts what it dropped, by reason, so a report says it (never a
silent drop); ``TaskPairs.multi_token`` counts the kept answers longer than one token.

>>> kept, dropped = usable_pairs(_Chars(), [("ab", "cd"), ("d", "ce"), ("e", "f")])
>>> kept, dict(dropped)
([('e', 'f')], {'answer first token shared': 2})
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

#: Todd et al.'s prompt format: a demonstration, the query; the answer follows the query (``" y"``)
TEMPLATE = ("Q: {x}\nA: {y}\n\n", "Q: {x}\nA:")

_ANTONYMS = """hot cold, big small, up down, good bad, fast slow, high low, old new, open closed, rich poor,
early late, happy sad, long short, hard soft, wet dry, true false, left right, in out, yes no, black white,
day night, win lose, love hate, strong weak, full empty, thick thin, clean dirty, buy sell, first last,
push pull, inside outside, above below, before after, top bottom, front back, north south, east west,
loud quiet, deep shallow, wide narrow, cheap expensive, sweet sour, safe dangerous, give take, near far,
light dark, young old, always never, more less, male female, rise fall"""

_CAPITALS = """France Paris, Germany Berlin, Italy Rome, Spain Madrid, Japan Tokyo, China Beijing,
Russia Moscow, Egypt Cairo, Greece Athens, Poland Warsaw, Austria Vienna, Ireland Dublin,
Portugal Lisbon, Norway Oslo, Sweden Stockholm, Finland Helsinki, Denmark Copenhagen, Hungary Budapest,
Turkey Ankara, Canada Ottawa, Australia Canberra, Kenya Nairobi, Peru Lima, Chile Santiago, Cuba Havana,
Thailand Bangkok, Vietnam Hanoi, Indonesia Jakarta, Iran Tehran, Iraq Baghdad, Syria Damascus,
Lebanon Beirut, Belgium Brussels, Netherlands Amsterdam, Switzerland Bern, Czechia Prague,
Romania Bucharest, Bulgaria Sofia, Serbia Belgrade, Ukraine Kyiv, Colombia Bogota, Venezuela Caracas,
Nigeria Abuja, Ghana Accra, Morocco Rabat, Philippines Manila, Korea Seoul, Pakistan Islamabad,
Afghanistan Kabul, Nepal Kathmandu, Iceland Reykjavik, England London, Latvia Riga, Croatia Zagreb"""

_WORDS = """apple house river music water garden paper window table mother father summer winter
money school doctor market letter number person animal flower island forest silver golden
morning evening island bottle candle castle dragon engine friend guitar hammer jacket kitchen
ladder mirror needle orange pencil rabbit rocket saddle tunnel violin wallet yellow"""

_FRENCH = """dog chien, cat chat, house maison, water eau, book livre, car voiture, sun soleil, moon lune,
tree arbre, bread pain, cheese fromage, apple pomme, red rouge, green vert, blue bleu, white blanc,
black noir, big grand, small petit, man homme, woman femme, child enfant, friend ami, city ville,
street rue, door porte, chair chaise, sea mer, mountain montagne, flower fleur, bird oiseau, fish poisson,
milk lait, wine vin, day jour, night nuit, year année, hand main, king roi, horse cheval, love amour,
world monde, good bon, one un, two deux, three trois, four quatre, five cinq, yes oui, thank merci"""

_PAST = """go went, see saw, eat ate, run ran, take took, give gave, make made, come came, know knew,
think thought, find found, tell told, write wrote, speak spoke, drink drank, sing sang, swim swam,
drive drove, fly flew, begin began, break broke, buy bought, bring brought, catch caught, teach taught,
sell sold, feel felt, keep kept, sleep slept, leave left, meet met, pay paid, send sent, build built,
spend spent, stand stood, win won, lose lost, hold held, sit sat, choose chose, forget forgot, grow grew,
throw threw, wake woke, fall fell, ride rode, hide hid"""


def _pairs(text: str) -> list[tuple[str, str]]:
    out = []
    for chunk in text.replace("\n", " ").split(","):
        a, b = chunk.split()
        out.append((a, b))
    return out


#: the project's tasks: ``{name: [(input, output), ...]}`` (inputs distinct within a task)
TASKS: dict[str, list[tuple[str, str]]] = {
    "antonym": _pairs(_ANTONYMS),
    "country-capital": _pairs(_CAPITALS),
    "capitalise": [(w, w.capitalize()) for w in dict.fromkeys(_WORDS.split())],
    "next-letter": [(chr(c), chr(c + 1)) for c in range(ord("a"), ord("z"))]
    + [(chr(c), chr(c + 1)) for c in range(ord("A"), ord("Z"))],
    "english-french": _pairs(_FRENCH),
    "present-past": _pairs(_PAST),
}


@dataclass(frozen=True)
class TaskPairs:
    """A task's usable pairs in one tokenizer: ``pairs`` kept, their ``answers`` (the first token id
    of ``" y"``), ``dropped`` (reason -> count) and ``multi_token`` (kept answers of several tokens,
    scored by their first)."""

    name: str
    pairs: tuple[tuple[str, str], ...]
    answers: tuple[int, ...]
    dropped: Counter
    multi_token: int = 0


def _ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def answer_id(tokenizer, y: str) -> int | None:
    """The first token id of ``" y"`` (as it follows ``"A:"``), None where it is unknown."""
    got = _ids(tokenizer, " " + y)
    unk = getattr(tokenizer, "unk_token_id", None)
    return got[0] if got and got[0] != unk else None


def usable_pairs(tokenizer, pairs) -> tuple[list[tuple[str, str]], Counter]:
    """``(kept, dropped)``: the pairs whose answer's first token is known and no other output's first
    token in ``pairs``, and whose input has no unknown token; ``dropped`` counts the others by reason
    (``"answer unknown"``, ``"answer first token shared"``, ``"input unknown"``)."""
    unk = getattr(tokenizer, "unk_token_id", None)
    firsts = Counter(answer_id(tokenizer, y) for _, y in pairs)
    kept, dropped = [], Counter()
    for x, y in pairs:
        a = answer_id(tokenizer, y)
        if a is None:
            dropped["answer unknown"] += 1
        elif firsts[a] > 1:
            dropped["answer first token shared"] += 1
        elif unk is not None and unk in _ids(tokenizer, " " + x):
            dropped["input unknown"] += 1
        else:
            kept.append((x, y))
    return kept, dropped


def task_pairs(tokenizer, name: str, pairs) -> TaskPairs:
    """:func:`usable_pairs` of one task, with the answers' first token ids."""
    kept, dropped = usable_pairs(tokenizer, pairs)
    multi = sum(len(_ids(tokenizer, " " + y)) > 1 for _, y in kept)
    return TaskPairs(name, tuple(kept), tuple(answer_id(tokenizer, y) for _, y in kept), dropped, multi)


def prompt_text(demos, query: str, template=TEMPLATE) -> str:
    """The prompt of ``demos`` (``(x, y)`` pairs) and the ``query`` input: each demonstration in
    ``template[0]``, then ``template[1]``.

    >>> prompt_text([("hot", "cold")], "up")
    'Q: hot\\nA: cold\\n\\nQ: up\\nA:'
    """
    return "".join(template[0].format(x=x, y=y) for x, y in demos) + template[1].format(x=query)


def prompt_ids(tokenizer, text: str) -> list[int]:
    """The prompt's token ids with the tokenizer's own special tokens (a BOS where it adds one)."""
    return list(tokenizer(text, add_special_tokens=True)["input_ids"])


class _Chars:
    """A toy tokenizer for the doctest: one token per character, no unknown token."""

    unk_token_id = None

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text.strip()]}
