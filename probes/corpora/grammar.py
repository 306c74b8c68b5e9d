"""A small seeded English grammar whose sentences carry gold UD v2 trees by construction.

Every rule that emits words also emits their arcs, so the trees need no parser and no
annotator. Templates: transitive, ditransitive, intransitive with obliques, passives,
copulas (adjective, noun, place), auxiliaries and modals, negation, adverbs, compounds,
possessives (``nmod:poss``), numerals, PP attachment to nouns and verbs, subject and
object relative clauses, ``xcomp`` and ``ccomp`` complements, fronted and final
adverbial clauses, and coordination of nouns, adjectives and clauses. Tokens are plain
words and punctuation separated by spaces (``did n't``, ``Anna 's``).

>>> s = generate(3, seed=7)
>>> [len(x) >= 5 for x in s]
[True, True, True]
>>> generate(3, seed=7) == s
True

Command line (rewrites the shipped files deterministically)::

    python -m headscope.probes.corpora.grammar conllu --seed 0 --n 800 --out data/syntax/generated.conllu
    python -m headscope.probes.corpora.grammar text --seed 1 --n 200 --keep-first 119 --out data/text/sentences.txt
"""

from __future__ import annotations

import argparse
import logging
import random
from pathlib import Path

from headscope.probes.corpora.conllu import DependencySentence, write_conllu

__all__ = ["generate", "detokenize", "main"]
log = logging.getLogger(__name__)

PEOPLE = [
    w.split("/")
    for w in (
        "teacher/teachers farmer/farmers child/children doctor/doctors pilot/pilots student/students "
        "neighbour/neighbours baker/bakers lawyer/lawyers nurse/nurses driver/drivers gardener/gardeners "
        "engineer/engineers painter/painters woman/women man/men boy/boys girl/girls dog/dogs cat/cats "
        "horse/horses fox/foxes goose/geese sailor/sailors librarian/librarians cartographer/cartographers "
        "apothecary/apothecaries blacksmith/blacksmiths"
    ).split()
]
THINGS = [
    w.split("/")
    for w in (
        "book/books letter/letters table/tables box/boxes window/windows apple/apples bicycle/bicycles "
        "map/maps lamp/lamps key/keys cake/cakes song/songs kettle/kettles ladder/ladders basket/baskets "
        "coat/coats report/reports photograph/photographs violin/violins lantern/lanterns compass/compasses "
        "parcel/parcels sextant/sextants quilt/quilts umbrella/umbrellas"
    ).split()
]
COMPOUNDS = [
    w.split("/")
    for w in (
        "coffee/machine/machines train/ticket/tickets paper/bag/bags kitchen/table/tables school/bus/buses "
        "piano/lesson/lessons apple/tree/trees rain/coat/coats city/map/maps football/match/matches "
        "tea/cup/cups garden/gate/gates birthday/cake/cakes river/boat/boats"
    ).split()
]
PLACES = "kitchen park station market library harbour village garden office museum forest hall attic".split()
NAMES = "Anna Marco Priya Tomas Yuki Omar Lena Kofi Sofia Ivan Mei Diego Amara Felix Ingrid Ravi".split()
ADJS = (
    "old small red quiet tired clever heavy bright young careful famous broken green strange enormous "
    "cheerful rusty ancient wooden nervous hungry patient"
).split()
DEGREE = "very quite rather extremely too".split()
ADVS = "quickly slowly quietly carefully suddenly there today again".split()
FREQ = "often always never sometimes".split()
PREPS_N = "with near from behind".split()
PREPS_V = "in at near behind".split()
NUMS = "two three four seven twelve 40 100".split()
# base, 3sg, past, past participle, -ing
TRANS = [
    v.split("/")
    for v in (
        "see/sees/saw/seen/seeing find/finds/found/found/finding carry/carries/carried/carried/carrying "
        "open/opens/opened/opened/opening read/reads/read/read/reading paint/paints/painted/painted/painting "
        "lift/lifts/lifted/lifted/lifting repair/repairs/repaired/repaired/repairing "
        "follow/follows/followed/followed/following watch/watches/watched/watched/watching "
        "clean/cleans/cleaned/cleaned/cleaning bring/brings/brought/brought/bringing "
        "take/takes/took/taken/taking hold/holds/held/held/holding build/builds/built/built/building "
        "draw/draws/drew/drawn/drawing sell/sells/sold/sold/selling borrow/borrows/borrowed/borrowed/borrowing "
        "describe/describes/described/described/describing admire/admires/admired/admired/admiring"
    ).split()
]
INTRANS = [
    v.split("/")
    for v in (
        "sleep/sleeps/slept/slept/sleeping arrive/arrives/arrived/arrived/arriving laugh/laughs/laughed/laughed/laughing "
        "wait/waits/waited/waited/waiting sing/sings/sang/sung/singing run/runs/ran/run/running "
        "work/works/worked/worked/working swim/swims/swam/swum/swimming smile/smiles/smiled/smiled/smiling"
    ).split()
]
DITRANS = [
    v.split("/")
    for v in (
        "give/gives/gave/given/giving send/sends/sent/sent/sending "
        "show/shows/showed/shown/showing hand/hands/handed/handed/handing"
    ).split()
]
CONTROL = [
    v.split("/")
    for v in (
        "want/wants/wanted/wanted/wanting decide/decides/decided/decided/deciding hope/hopes/hoped/hoped/hoping "
        "try/tries/tried/tried/trying refuse/refuses/refused/refused/refusing plan/plans/planned/planned/planning"
    ).split()
]
SAY = [
    v.split("/")
    for v in (
        "say/says/said/said/saying think/thinks/thought/thought/thinking "
        "know/knows/knew/known/knowing hear/hears/heard/heard/hearing"
    ).split()
]
SUBORD = "because when although after before while if".split()
MODALS = "will can could should might must".split()


class _Tree:
    """Words, tags and arcs of one sentence under construction (heads filled as rules close)."""

    def __init__(self) -> None:
        self.words: list[str] = []
        self.upos: list[str] = []
        self.heads: list[int | None] = []
        self.rels: list[str | None] = []

    def add(self, word: str, upos: str) -> int:
        self.words.append(word)
        self.upos.append(upos)
        self.heads.append(None)
        self.rels.append(None)
        return len(self.words) - 1

    def link(self, dep: int, head: int, rel: str) -> None:
        self.heads[dep], self.rels[dep] = head, rel


class _Grammar:
    def __init__(self, rng: random.Random) -> None:
        self.r = rng

    def p(self, prob: float) -> bool:
        return self.r.random() < prob

    def c(self, seq):
        return self.r.choice(seq)

    # ---- noun phrases: each returns (head index, number) ----
    def np(self, t: _Tree, *, animate: bool, depth: int, allow_pron: bool = False) -> tuple[int, str]:
        r = self.r.random()
        if allow_pron and r < 0.08:
            word, num = self.c(
                [("he", "sg"), ("she", "sg"), ("they", "pl"), ("we", "pl")]
                if animate
                else [("it", "sg"), ("they", "pl")]
            )
            return t.add(word, "PRON"), num
        if animate and r < 0.3:
            return t.add(self.c(NAMES), "PROPN"), "sg"
        if r < 0.42 and depth > 0:
            head, num = self.possessive(t, animate=animate)
        else:
            head, num = self.common_np(t, animate=animate)
        if depth > 0 and self.p(0.12):
            head, num = self.coordinate_np(t, head, animate=animate), "pl"
        elif depth > 0 and self.p(0.18):
            self.pp(t, head, "nmod", depth - 1, PREPS_N)
        elif depth > 0 and self.p(0.15):
            self.relative(t, head, animate=animate, num=num, depth=depth - 1)
        return head, num

    def common_np(self, t: _Tree, *, animate: bool) -> tuple[int, str]:
        num = "pl" if self.p(0.35) else "sg"
        mods: list[tuple[int, str]] = []
        if num == "pl" and self.p(0.3):
            if self.p(0.5):
                mods.append((t.add(self.c(["the", "these", "those"]), "DET"), "det"))
            mods.append((t.add(self.c(NUMS), "NUM"), "nummod"))
        else:
            det = self.c(["the", "the", "a", "this", "every"] if num == "sg" else ["the", "the", "some", "these"])
            mods.append((t.add(det, "DET"), "det"))
        for word in self.r.sample(ADJS, self.c([0, 0, 0, 1, 1, 2])):
            if self.p(0.2):
                deg = t.add(self.c(DEGREE[:3]), "ADV")
                adj = t.add(word, "ADJ")
                t.link(deg, adj, "advmod")
            else:
                adj = t.add(word, "ADJ")
            mods.append((adj, "amod"))
        if not animate and self.p(0.3):
            mod, sg, pl = self.c(COMPOUNDS)
            mods.append((t.add(mod, "NOUN"), "compound"))
            noun = sg if num == "sg" else pl
        else:
            noun = self.c(PEOPLE if animate else THINGS)[0 if num == "sg" else 1]
        head = t.add(noun, "NOUN")
        for dep, rel in mods:
            t.link(dep, head, rel)
        return head, num

    def possessive(self, t: _Tree, *, animate: bool) -> tuple[int, str]:
        if self.p(0.4):
            owner = t.add(self.c(["her", "his", "their", "our"]), "PRON")
        else:
            if self.p(0.5):
                owner = t.add(self.c(NAMES), "PROPN")
            else:
                det = t.add(self.c(["the", "the", "a", "this"]), "DET")
                owner = t.add(self.c(PEOPLE)[0], "NOUN")
                t.link(det, owner, "det")
            t.link(t.add("'s", "PART"), owner, "case")
        num = "pl" if self.p(0.3) else "sg"
        head = t.add(self.c(PEOPLE if animate else THINGS)[0 if num == "sg" else 1], "NOUN")
        t.link(owner, head, "nmod:poss")
        return head, num

    def coordinate_np(self, t: _Tree, first: int, *, animate: bool) -> int:
        if self.p(0.3):
            comma = t.add(",", "PUNCT")
            mid, _ = self.common_np(t, animate=animate)
            t.link(comma, mid, "punct")
            t.link(mid, first, "conj")
        cc = t.add(self.c(["and", "and", "or"]), "CCONJ")
        if animate and self.p(0.4):
            last = t.add(self.c(NAMES), "PROPN")
        else:
            last, _ = self.common_np(t, animate=animate)
        t.link(cc, last, "cc")
        t.link(last, first, "conj")
        return first

    def pp(self, t: _Tree, attach: int, rel: str, depth: int, preps) -> int:
        case = t.add(self.c(preps), "ADP")
        if rel != "nmod":
            head, _ = self.place(t)
        elif self.p(0.7):
            head, _ = self.common_np(t, animate=False)
        else:
            head, _ = self.np(t, animate=True, depth=depth)
        t.link(case, head, "case")
        t.link(head, attach, rel)
        return head

    def place(self, t: _Tree) -> tuple[int, str]:
        det = t.add("the", "DET")
        head = t.add(self.c(PLACES), "NOUN")
        t.link(det, head, "det")
        return head, "sg"

    def relative(self, t: _Tree, noun: int, *, animate: bool, num: str, depth: int) -> None:
        if self.p(0.5) and animate:  # subject relative: the dog that carried the box
            rel = t.add("who" if self.p(0.5) else "that", "PRON")
            verb = self.verb_group(t, self.c(TRANS), num, simple=True)
            obj, _ = self.np(t, animate=False, depth=0)
            t.link(rel, verb, "nsubj")
            t.link(obj, verb, "obj")
        elif self.p(0.4) and not animate:  # passive subject relative: the box which was opened
            rel = t.add(self.c(["which", "that"]), "PRON")
            verb = self.verb_group(t, self.c(TRANS), num, passive=True)
            t.link(rel, verb, "nsubj:pass")
        else:  # object relative: the book that Anna read
            rel = t.add(self.c(["that", "which"]) if not animate else "that", "PRON")
            subj, snum = self.np(t, animate=True, depth=0)
            verb = self.verb_group(t, self.c(TRANS), snum, simple=True)
            t.link(rel, verb, "obj")
            t.link(subj, verb, "nsubj")
        t.link(verb, noun, "acl:relcl")

    # ---- verbs and clauses ----
    def verb_group(self, t: _Tree, forms, num: str, *, simple: bool = False, passive: bool = False) -> int:
        """Emit auxiliaries, negation, a frequency adverb and the verb; returns the verb index."""
        deps: list[tuple[int, str]] = []
        kinds = ["past", "past", "present", "modal", "perfect", "progressive", "neg"]
        kind = "past" if simple or passive else self.c(kinds)
        if passive:
            be = self.c(["was", "is"] if num == "sg" else ["were", "are"])
            deps.append((t.add(be, "AUX"), "aux:pass"))
            word = forms[3]
        elif kind == "past":
            word = forms[2]
        elif kind == "present":
            word = forms[1] if num == "sg" else forms[0]
        elif kind == "modal":
            deps.append((t.add(self.c(MODALS), "AUX"), "aux"))
            word = forms[0]
        elif kind == "perfect":
            deps.append((t.add(self.c(["had", "has" if num == "sg" else "have"]), "AUX"), "aux"))
            word = forms[3]
        elif kind == "progressive":
            deps.append((t.add(self.c(["was", "is"] if num == "sg" else ["were", "are"]), "AUX"), "aux"))
            word = forms[4] if len(forms) > 4 else forms[2]
        else:
            deps.append((t.add(self.c(["did", "does" if num == "sg" else "do"]), "AUX"), "aux"))
            deps.append((t.add(self.c(["not", "n't"]), "PART"), "advmod"))
            word = forms[0]
        if not simple and not passive and kind != "neg" and self.p(0.12):
            deps.append((t.add(self.c(FREQ), "ADV"), "advmod"))
        verb = t.add(word, "VERB")
        for dep, rel in deps:
            t.link(dep, verb, rel)
        return verb

    def clause(self, t: _Tree, depth: int) -> int:
        """A clause without final punctuation; returns its head (predicate) index."""
        kind = self.c(
            [
                "trans",
                "trans",
                "trans",
                "intrans",
                "ditrans",
                "cop_adj",
                "cop_noun",
                "cop_place",
                "passive",
                "xcomp",
                "ccomp",
            ]
            if depth > 0
            else ["trans", "intrans", "cop_adj", "cop_place"]
        )
        subj, num = self.np(t, animate=kind != "passive", depth=depth, allow_pron=True)
        subj_rel = "nsubj:pass" if kind == "passive" else "nsubj"
        if kind.startswith("cop"):
            head = self.copula(t, kind, num)
        elif kind == "passive":
            head = self.verb_group(t, self.c(TRANS), num, passive=True)
            if self.p(0.6):
                by = t.add("by", "ADP")
                agent, _ = self.np(t, animate=True, depth=0)
                t.link(by, agent, "case")
                t.link(agent, head, "obl:agent")
        else:
            lex = {"trans": TRANS, "intrans": INTRANS, "ditrans": DITRANS, "xcomp": CONTROL, "ccomp": SAY}[kind]
            head = self.verb_group(t, self.c(lex), num)
            if kind == "ditrans":
                iobj, _ = self.np(t, animate=True, depth=0)
                t.link(iobj, head, "iobj")
            if kind in ("trans", "ditrans"):
                obj, _ = self.np(t, animate=False, depth=depth - 1)
                t.link(obj, head, "obj")
            elif kind == "xcomp":
                to = t.add("to", "PART")
                verb = t.add(self.c(TRANS)[0], "VERB")
                obj, _ = self.np(t, animate=False, depth=0)
                t.link(to, verb, "mark")
                t.link(obj, verb, "obj")
                t.link(verb, head, "xcomp")
            elif kind == "ccomp":
                mark = t.add("that", "SCONJ") if self.p(0.7) else None
                inner = self.clause(t, depth - 1)
                if mark is not None:
                    t.link(mark, inner, "mark")
                t.link(inner, head, "ccomp")
        t.link(subj, head, subj_rel)
        if kind in ("trans", "intrans", "passive") and self.p(0.45):
            self.pp(t, head, "obl", depth - 1, PREPS_V)
        if self.p(0.25):
            adverbs = ADVS if kind in ("trans", "intrans", "passive", "ditrans") else ADVS[-3:]
            t.link(t.add(self.c(adverbs), "ADV"), head, "advmod")
        return head

    def copula(self, t: _Tree, kind: str, num: str) -> int:
        deps: list[tuple[int, str]] = []
        negate = self.p(0.15)
        if self.p(0.2):  # might not be
            deps.append((t.add(self.c(["will", "might", "can"]), "AUX"), "aux"))
            if negate:
                deps.append((t.add("not", "PART"), "advmod"))
            deps.append((t.add("be", "AUX"), "cop"))
        else:  # was not
            deps.append((t.add(self.c(["was", "is"] if num == "sg" else ["were", "are"]), "AUX"), "cop"))
            if negate:
                deps.append((t.add(self.c(["not", "n't"]), "PART"), "advmod"))
        if kind == "cop_adj":
            if self.p(0.4):
                deps.append((t.add(self.c(DEGREE), "ADV"), "advmod"))
            head = t.add(self.c(ADJS), "ADJ")
            if self.p(0.15):
                cc = t.add("and", "CCONJ")
                other = t.add(self.c(ADJS), "ADJ")
                t.link(cc, other, "cc")
                t.link(other, head, "conj")
        elif kind == "cop_noun":
            if num == "sg":
                deps.append((t.add("a", "DET"), "det"))
            if self.p(0.4):
                deps.append((t.add(self.c(ADJS), "ADJ"), "amod"))
            head = t.add(self.c(PEOPLE)[0 if num == "sg" else 1], "NOUN")
        else:
            deps.append((t.add(self.c(PREPS_V), "ADP"), "case"))
            head, _ = self.place(t)
        for dep, rel in deps:
            t.link(dep, head, rel)
        return head

    def sentence(self, depth: int) -> _Tree:
        t = _Tree()
        shape = self.r.random()
        if shape < 0.15:  # fronted adverbial clause: When X , Y .
            mark = t.add(self.c(SUBORD).capitalize(), "SCONJ")
            sub = self.clause(t, 0)
            comma = t.add(",", "PUNCT")
            root = self.clause(t, depth)
            t.link(mark, sub, "mark")
            t.link(comma, sub, "punct")
            t.link(sub, root, "advcl")
        else:
            root = self.clause(t, depth)
            if shape < 0.35:  # final adverbial clause
                mark = t.add(self.c(SUBORD), "SCONJ")
                sub = self.clause(t, depth - 1)
                t.link(mark, sub, "mark")
                t.link(sub, root, "advcl")
            elif shape < 0.5:  # coordinated clause
                comma = t.add(",", "PUNCT") if self.p(0.5) else None
                cc = t.add(self.c(["and", "but", "so"]), "CCONJ")
                other = self.clause(t, depth - 1)
                if comma is not None:
                    t.link(comma, other, "punct")
                t.link(cc, other, "cc")
                t.link(other, root, "conj")
        t.link(t.add(self.c([".", ".", ".", ".", "!"]), "PUNCT"), root, "punct")
        t.link(root, -1, "root")
        for i in range(len(t.words) - 1):
            if t.words[i] == "a" and t.words[i + 1][0] in "aeiou":
                t.words[i] = "an"
        t.words[0] = t.words[0][0].upper() + t.words[0][1:]
        return t


def generate(n: int, *, seed: int = 0, min_words: int = 5, max_words: int = 30) -> list[DependencySentence]:
    """``n`` sentences with gold trees, deterministic for ``seed``; lengths within
    ``[min_words, max_words]`` (punctuation counts as a word)."""
    if n < 0 or min_words < 3 or max_words < min_words:
        raise ValueError(
            f"need n >= 0 and 3 <= min_words <= max_words; got n={n}, min_words={min_words}, max_words={max_words}"
        )
    g = _Grammar(random.Random(seed))
    out: list[DependencySentence] = []
    while len(out) < n:
        t = g.sentence(depth=g.c([1, 2, 2, 3]))
        if not min_words <= len(t.words) <= max_words:
            continue
        if None in t.heads:
            raise RuntimeError(f"grammar bug: a word without a head in {t.words}")
        out.append(
            DependencySentence(
                words=tuple(t.words),
                heads=tuple(t.heads),
                relations=tuple(t.rels),
                upos=tuple(t.upos),
                sent_id=f"gen-{seed}-{len(out) + 1:04d}",
            )
        )
    return out


def detokenize(words) -> str:
    """Plain text for generated words: punctuation and clitics attach to the word before.

    >>> detokenize(["Anna", "'s", "dog", "did", "n't", "bark", ",", "and", "it", "slept", "."])
    "Anna's dog didn't bark, and it slept."
    """
    text = ""
    for w in words:
        text += w if (not text or w in {".", ",", "!", "?", ";", ":", "'s", "n't"}) else " " + w
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m headscope.probes.corpora.grammar", description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["conllu", "text"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n", type=int, default=800)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--keep-first", type=int, default=0, help="text: keep this many existing lines of --out first")
    args = ap.parse_args(argv)
    sentences = generate(args.n, seed=args.seed)
    if args.what == "conllu":
        write_conllu(args.out, sentences)
    else:
        kept = args.out.read_text(encoding="utf-8").splitlines()[: args.keep_first] if args.keep_first else []
        lines = kept + [detokenize(s.words) for s in sentences]
        args.out.write_text("\n".join(lines) + "\n", encoding="utf-8", newline="\n")
    log.info("wrote %d sentences to %s", len(sentences), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
