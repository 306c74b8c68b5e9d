"""Templates that write the shipped coreference probe set (``data/coref/coref.jsonl``).

A template is one line of tokens: ``[`` and ``]`` bracket a candidate span, ``^``
marks a candidate's head when it is not the span's last word, ``*it*`` marks the
pronoun, ``{a|b}`` is the switch of a minimal pair (choice *k* makes candidate
``gold[k]`` the antecedent), ``$F1 $F2 $M1 $M2 $F $M`` are filled with names.

>>> item = parse_template("[The cat] did n't climb on [the table] because *it* was too {tired|tall} .", 1)
>>> item["words"][-2], item["pronoun"], item["candidates"]
('tall', 9, [[0, 2], [6, 8]])

Every item comes in a minimal pair (``pair`` names the partner) in which one change
moves the antecedent: the switch word (``kind="winograd"``), the pronoun's gender
(``"gender"``), or which noun is plural (``"number"``)::

    python -m headscope.probes.corpora.coref_templates --out data/coref/coref.jsonl
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import re
from pathlib import Path

__all__ = ["parse_template", "build_items", "main"]
log = logging.getLogger(__name__)

WINOGRAD = [  # switch choice 0 makes candidate 0 the antecedent, choice 1 candidate 1
    "[The cat] did n't climb on [the table] because *it* was too {tired|tall} .",
    "[The boat] could not pass under [the bridge] because *it* was too {wide|low} .",
    "[The dog] could not catch [the ball] because *it* was too {slow|fast} .",
    "[The rope] could not hold [the piano] because *it* was too {thin|heavy} .",
    "[The laptop] did not fit on [the shelf] because *it* was too {wide|narrow} .",
    "[The crane] could not lift [the container] because *it* was too {weak|heavy} .",
    "[The truck] could not enter [the tunnel] because *it* was too {high|low} .",
    "[The painting] would not go through [the door] because *it* was too {large|narrow} .",
    "[The horse] did n't jump over [the fence] because *it* was too {tired|high} .",
    "[The goat] could not reach [the apple] because *it* was too {short|high} .",
    "[The mouse] escaped from [the cat] because *it* was {quick|slow} .",
    "[The sparrow] could not crack [the seed] because *it* was too {weak|hard} .",
    "[The ladder] did not reach [the roof] because *it* was too {short|high} .",
    "[The blanket] did not cover [the bed] because *it* was too {small|large} .",
    "[The lamp] did not light [the room] because *it* was too {dim|large} .",
    "[The car] overtook [the bus] because *it* was {faster|slower} .",
    "[The suitcase] would not close over [the coat] because *it* was too {small|bulky} .",
    "[The bottle] would not stand in [the drawer] because *it* was too {tall|shallow} .",
    "[The kettle] would not fit under [the tap] because *it* was too {tall|low} .",
    "[The ship] could not dock at [the pier] because *it* was too {big|short} .",
    "[$F1] thanked [$F2] because *she* was {grateful|helpful} .",
    "[$M1] lent money to [$M2] because *he* was {rich|broke} .",
    "[$F1] beat [$F2] at chess because *she* was {clever|distracted} .",
    "[$M1] hired [$M2] because *he* was {busy|skilled} .",
    "[$F1] envied [$F2] because *she* was {poor|rich} .",
    "[$M1] could not hear [$M2] because *he* was {distracted|whispering} .",
    "[$M1] apologised to [$M2] because *he* had been {rude|offended} .",
    "[The teacher] scolded [the student] because *she* was {furious|late} .",
    "[The nurse] could not visit [the patient] because *she* was {busy|contagious} .",
    "[The lawyers] questioned [the witnesses] because *they* were {curious|evasive} .",
    "[The parents] praised [the children] because *they* were {proud|polite} .",
    "[The manager] fired [the clerk] because *he* was {angry|lazy} .",
    "[The police] arrested [the thieves] because *they* were {alert|careless} .",
    "[The coach] congratulated [the swimmer] because *she* was {impressed|victorious} .",
    "[The doctor] reassured [the patient] because *he* was {kind|frightened} .",
    "[The guests] thanked [the hosts] because *they* were {grateful|generous} .",
]
GENDER = [  # $F is a woman, $M a man; pronoun choice 0 refers to candidate 0, choice 1 to candidate 1
    "[$F] met [$M] and *{she|he}* smiled .",
    "[$M] phoned [$F] because *{he|she}* needed [the keys] .",
    "[$M] gave [$F] [a book] before *{he|she}* left .",
    "[$F] told [$M] that *{she|he}* would bring [the map] .",
    "After [$M] visited [$F] , *{he|she}* cooked dinner .",
    "[$M] waved at [$F] , but *{he|she}* did n't stop .",
    "[$F] asked [$M] where *{she|he}* had parked [the van] .",
    "[$F 's ^brother] met [$F2] and *{he|she}* laughed .",
    "[The ^woman in the red coat] greeted [$M] and *{she|he}* sat down .",
    "[$M] showed [$F] [the garden] while *{he|she}* talked about [the weather] .",
]
NUMBER = [  # "they" refers to the plural noun: choice 0 -> candidate 1, choice 1 -> candidate 0
    "[The {lawyer|lawyers}] called [the {witnesses|witness}] because *they* needed a statement .",
    "[The {nurse|nurses}] helped [the {patients|patient}] while *they* waited .",
    "[The {farmer|farmers}] fed [the {goats|goat}] before *they* went to the market .",
    "[The {chef|chefs}] thanked [the {waiters|waiter}] after *they* finished the service .",
    "[The {pilot|pilots}] greeted [the {passengers|passenger}] as *they* boarded .",
    "[The {guide|guides}] warned [the {hikers|hiker}] that *they* were near the cliff .",
    "[The {editor|editors}] phoned [the {authors|author}] because *they* had missed the deadline .",
    "[The {coach|coaches}] watched [the {players|player}] while *they* trained .",
    "[The {librarian|librarians}] helped [the {students|student}] until *they* found the atlas .",
    "[The {baker|bakers}] paid [the {suppliers|supplier}] before *they* closed for the winter .",
]
FEMALE = ["Anna", "Clara", "Priya", "Mei", "Sofia", "Lena", "Amara", "Ingrid"]
MALE = ["Tom", "Ben", "Omar", "Ravi", "Ivan", "Diego", "Kofi", "Felix"]


def parse_template(template: str, choice: int, names: dict[str, str] | None = None) -> dict:
    """Words, pronoun index and candidate spans (plus heads where marked) of one filled template."""
    text = re.sub(r"\{([^{}|]*)\|([^{}|]*)\}", lambda m: m[1 + choice], template)
    for key, name in sorted((names or {}).items(), key=lambda kv: -len(kv[0])):
        text = text.replace(key, name)
    words, candidates, heads, pronoun, start, head = [], [], [], None, None, None
    for token in text.split():
        if token.startswith("["):
            start, head, token = len(words), None, token[1:]
        closes = token.endswith("]")
        token = token.rstrip("]")
        if token.startswith("^"):
            head, token = len(words), token[1:]
        if token.startswith("*") and token.endswith("*"):
            pronoun, token = len(words), token.strip("*")
        words.append(token)
        if closes:
            candidates.append([start, len(words)])
            heads.append(len(words) - 1 if head is None else head)
    item = {"words": words, "pronoun": pronoun, "candidates": candidates}
    if any(h != end - 1 for h, (_, end) in zip(heads, candidates)):
        item["heads"] = heads
    return item


def _pair(kind: str, number: int, template: str, golds: tuple[int, int], names: dict[str, str]) -> list[dict]:
    items = []
    for choice, suffix in ((0, "a"), (1, "b")):
        item = {"id": f"{kind}-{number:03d}{suffix}", **parse_template(template, choice, names)}
        item["antecedent"] = golds[choice]
        item["pair"] = f"{kind}-{number:03d}{'b' if suffix == 'a' else 'a'}"
        item["kind"] = kind
        items.append(item)
    return items


def build_items(seed: int = 0) -> list[dict]:
    """All coreference items as JSON-ready dicts, deterministic for ``seed``."""
    rng = random.Random(seed)
    items: list[dict] = []
    n = 0
    for template in WINOGRAD:
        women, men = rng.sample(FEMALE, 6), rng.sample(MALE, 6)
        for k in range(3 if "$" in template else 1):  # distinct name pairs per template
            n += 1
            names = {"$F1": women[2 * k], "$F2": women[2 * k + 1], "$M1": men[2 * k], "$M2": men[2 * k + 1]}
            items += _pair("winograd", n, template, (0, 1), names)
    n = 0
    for template in GENDER:
        women, men = rng.sample(FEMALE, 6), rng.sample(MALE, 5)
        for k in range(5):
            n += 1
            items += _pair("gender", n, template, (0, 1), {"$F2": women[k + 1], "$F": women[k], "$M": men[k]})
    n = 0
    for template in NUMBER:
        n += 1
        items += _pair("number", n, template, (1, 0), {})
    return items


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m headscope.probes.corpora.coref_templates", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    items = build_items(args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(i, ensure_ascii=False) + "\n" for i in items), encoding="utf-8")
    log.info("wrote %d items to %s", len(items), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
