"""Q&A pairs mined from running text, without any model: what a page's prose itself states.

A corpus of plain prose (no headings, definition lists or option tables for extract.py to ask about) still says what
things are, what they are for, how to do something and what happens when. Reading-comprehension mining (AdaptLLM,
"Adapting LLMs via reading comprehension", ICLR 2024) turns such sentences into questions; the answer is always the
sentence itself, whole, as the cleaned text holds it:

  definition  "A bare repository is a repository that has no working tree."     What is a bare repository?
  meaning     "HEAD refers to the commit you have checked out."                  What does HEAD refer to?
  purpose     "The reflog is used to recover lost commits." / "X lets you ..."   What is the reflog used for?
  default     "By default, `git push` sends only the current branch."            What does `git push` do by default?
  procedure   "To undo the last commit, run git reset HEAD~1."                   How do I undo the last commit?
  condition   "If the file is missing, `sqlite3_open()` creates it."            What does `sqlite3_open()` do if ...?
  behaviour   "`git gc` removes unreachable objects older than two weeks."      What does `git gc` do?
  location    "Global settings are stored in ~/.gitconfig."                      Where are global settings stored?

A sentence is used only when it reads as prose (6-60 words, a whole sentence, little code), when its subject is
a name (`--force`, `core.editor`, sqlite3_open()) or a short noun phrase that makes sense out of context (no "it",
"this option", "the following"), and when the answer says at least MIN_NEW_WORDS content words the question does not
(so "X is enabled by default." never answers "Is X enabled by default?"). A sentence that opens "This command/tool/
option ..." is about the document's own subject: with one (a title, a meaningful file name) it is asked about that.
English and Spanish patterns; other languages get none (the report says so).

    pairs = mine(text, lang="en", seed=0, subject="git-gc")   # [Mined(question, answer, kind)]
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pretrain.qa import questions
from pretrain.qa.extract import normalize, sentences

MIN_WORDS, MAX_WORDS = 6, 60
MIN_NEW_WORDS = 3
MAX_CODE_SHARE = 0.25


@dataclass(frozen=True)
class Mined:
    question: str
    answer: str
    kind: str  # the qtype: prose_definition, prose_purpose, ...


# ----------------------------------------------------------------------------------------------------------------
# subjects: a name a user types, or a short noun phrase


def _set(words: str) -> frozenset[str]:
    return frozenset(words.split())


# A token with code in it: `quoted`, an option, a dotted or underscored name, a call, a path, a variable, <arg>.
CODE = r"(?:`[^`]+`|--?[A-Za-z][\w-]*(?:=\S+)?|[A-Za-z_][\w-]*(?:[._:][\w*<>-]+)+(?:\(\d?\))?|[A-Za-z_]\w*\(\d?\)" \
       r"|\$[A-Za-z_]\w*|[A-Z][A-Z0-9]*_[A-Z0-9_]+|<[\w-]+>|/[\w.-]+(?:/[\w.*-]+)*)"  # fmt: skip
NOUNS = (
    r"(?:command|option|flag|setting|variable|directive|function|method|file|program|tool|utility|package"
    r"|module|library|hook|parameter|field|key|macro|class|type|clause|statement|keyword|header|protocol|format)"
)
# "the git-push command", "the core.editor setting": a name, then the kind of thing it is
NAMED = rf"(?:[Tt]he )?(?:{CODE}|(?!(?:the|a|an|this|that|each|every|any|some|its|their|your)\b)[a-z][\w-]*" \
        rf"(?: [a-z][\w.-]*)?) {NOUNS}"  # fmt: skip
NP = r"(?:[A-Za-z][\w'-]*)(?: [A-Za-z][\w'-]*){0,4}?"
SUBJECT = rf"(?P<s>{NAMED}|{CODE}|{NP})"
TASK = r"(?P<t>[a-z][^,;:()]{5,90}?)"
LEAD = re.compile(
    r"^(?:Note that|Also|Normally|Usually|Typically|In general|In short|Generally|Simply put|"
    r"Additionally|However|Moreover|Furthermore|Instead|Otherwise|Alternatively|Finally|Currently|"
    r"Internally|Optionally|Then|Now|In practice|In addition|For (?:this|that) reason),? "
)

NOT_SUBJECT_WORDS = _set("""it its they them their this that these those he she we you i one there here which what
who whom whose where when why how such same other another each every some any all most both either neither none
nothing something anything everything above below following latter former so once if unless after before since
while although because until then thus also only just not no very more less many few often usually always never
sometimes can could will would should must may might is are was were be been being do does did has have had please
see note cannot can't won't isn't aren't doesn't don't though nowadays currently therefore hence however instead
otherwise even itself themselves""")
# Imperatives that open a sentence ("Make sure ...", "Use ..."): never the first word of a subject.
IMPERATIVES = _set("""make use set run see note try keep avoid let give take put do add remove show list create
delete update check install specify pass call edit write read open close start stop enable disable""")
PREPOSITIONS = _set("in on at for with from by of to into onto over under about as per via")
GENERIC = _set("""command option file result output value argument name path script program function directory
message list entry line default first second last thing way case example step problem answer information data rest
effect behaviour behavior change process operation mode form pattern type key field format string number size text
flag bit object user setting variable values arguments options system time part section document page following
new next same other the a an""")
CONTEXT = re.compile(r"\b(?:this|these|those|such) (?:option|command|flag|mode|setting|variable|value|file|case|form|"
                     r"one|format|field|example|section|page|step|method|function)s?\b|\b(?:above|below|as follows|"
                     r"the following|in following|shown here|like this|see also)\b", re.I)  # fmt: skip
EVALUATIVE = _set("""good bad great common useful easy simple mistake error lot little bit problem matter few
nice better best worse fine way must possibility chance valid thing idea""")
# A paragraph that opens by naming its subject: "`--date=unix` shows ...", "The staging area is ..."
TOPIC = re.compile(
    rf"^(?:(?P<s>{NAMED}|{CODE}) (?:\w+ )?[a-z]+\b|(?P<n>(?:The |An? )?{NP}) (?:is|are|can|will|must|"
    r"should|may|has|have|does|do|lets|allows)\b|(?P<d>(?:The|An?) {NP}) (?:also |only )?[a-z]{3,}s\b)"
)
MAX_TOPIC_SENTENCES, MAX_TOPIC_CHARS = 3, 600
TOPIC_MIN_WORDS = 12  # a paragraph of one sentence answers "Tell me about X" only when it says this much
THIS_SUBJECT = re.compile(r"^(?:This|The) (?:command|program|tool|utility|application|function|module|library|package|"
                          r"script|manual page|page|document) (?:(?P<is>is an?)|(?!is\b|has\b|was\b|does\b)"
                          r"[a-z]{3,}s)\b")  # fmt: skip
# A document's first sentence in the imperative (a man page's summary: "Show information about files in the index.")
SUMMARY = re.compile(r"^(?:Show|List|Add|Create|Remove|Delete|Update|Record|Read|Write|Print|Compute|Compare|Apply|"
                     r"Convert|Send|Receive|Download|Upload|Manage|Move|Copy|Rename|Check|Verify|Find|Search|Display|"
                     r"Install|Run|Start|Stop|Set|Get|Produce|Generate|Build|Extract|Import|Export|Join|Merge|Split|"
                     r"Prepare|Prune|Pack|Count|Reset|Restore|Switch|Clone|Fetch|Push|Pull|Summarize|Edit|Mark|Test|"
                     r"Provide|Manipulate|Inspect|Lock|Unlock|Encrypt|Decrypt|Sign|Open|Close|Parse|Format)"
                     r" (?:the |a |an |all |one |files?|information|changes?|objects?|[a-z])")  # fmt: skip


def is_code(subject: str) -> bool:
    return re.fullmatch(CODE, subject) is not None


def good_subject(subject: str) -> bool:
    """A name, or 1-5 words naming something out of context (no pronoun, no clause, not only generic words)."""
    if is_code(subject) or re.fullmatch(NAMED, subject):
        return True
    words = [w.lower() for w in subject.split()]
    if not 1 <= len(words) <= 5 or any(w in NOT_SUBJECT_WORDS for w in words) or words[0] in PREPOSITIONS:
        return False
    if len(words) > 1 and subject[:1].isupper() and words[0] in IMPERATIVES:
        return False  # "Make sure committers": an instruction, not a thing
    if all(w in GENERIC or w.rstrip("s") in GENERIC for w in words) or words[-1] in (
        "of",
        "for",
        "and",
        "or",
        "to",
        "in",
        "with",
        "the",
        "a",
    ):
        return False
    if words[0].endswith("ing") and len(words) > 1:
        return False  # "Using --force is ...": a clause, not a thing
    return not (len(words) > 1 and words[-1].endswith("ed"))  # "the keys supported": a clause cut short


def shown(subject: str, proper: frozenset[str] = frozenset()) -> str:
    """The subject as a question shows it mid-sentence: a name in backticks; its first word lowercased unless the
    text capitalises it mid-sentence too (Git, Debian) or it is an acronym."""
    if is_code(subject):
        return subject if subject.startswith("`") else f"`{subject}`"
    first, _, rest = subject.partition(" ")
    if first[:1].isupper() and first not in proper and (first[1:].islower() and len(first) > 1 or first == "A"):
        first = first.lower()
    return f"{first} {rest}".strip()


def proper_nouns(text: str) -> frozenset[str]:
    """Capitalised words the text also writes capitalised mid-sentence: names, kept as written in questions."""
    return frozenset(re.findall(r"(?<=[a-z,;] )[A-Z][a-z]+", text)) - {"The", "A", "An", "This", "It", "If", "When"}


def be(subject: str) -> str:
    head = subject.split()[-1].strip("`").lower()
    return "are" if head.endswith("s") and not head.endswith(("ss", "us", "is")) and " of " not in subject else "is"


def base_verb(verb: str) -> str:
    """'holds' -> 'hold', 'specifies' -> 'specify' (regular -s forms)."""
    if verb.endswith("ies"):
        return verb[:-3] + "y"
    if re.search(r"(ch|sh|ss|x)es$", verb):
        return verb[:-2]
    return verb[:-1] if verb.endswith("s") else verb


# ----------------------------------------------------------------------------------------------------------------
# the patterns: (kind, regex on the sentence); the first whose parts pass the checks makes the pair

PATTERNS: dict[str, list[tuple[str, re.Pattern[str]]]] = {
    "en": [
        (
            "prose_meaning",
            re.compile(
                rf"^{SUBJECT} (?:refers? to|means|denotes|stands for|is short for|is an? "
                r"(?:synonym|alias|abbreviation|shorthand) (?:for|of)) (?!that\b)\S"
            ),
        ),
        ("prose_definition", re.compile(rf"^{SUBJECT},? (?:also|sometimes|often) (?:called|known as) ")),
        ("prose_purpose", re.compile(rf"^The (?:main |primary )?(?:purpose|goal|aim|role|job) of {SUBJECT} is \S")),
        ("prose_purpose", re.compile(rf"^{SUBJECT} (?:is|are|can be|may be) (?:\w+ly )?used (?:to|for) \S")),
        ("prose_enables", re.compile(rf"^{SUBJECT} (?:lets|allows|enables|helps|permits) (?:you|users|the user)\b")),
        ("prose_default", re.compile(rf"^By default, (?P<s>{NAMED}|{CODE}) (?:\w+ )?[a-z]+s\b")),
        (
            "prose_default_np",
            re.compile(
                rf"^By default, (?P<n>{NP}) (?:is|are|will|does|do|can|cannot|only|always|"
                r"never)\b"
            ),
        ),  # fmt: skip
        ("prose_default_to", re.compile(rf"^{SUBJECT} defaults? to \S")),
        (
            "prose_location",
            re.compile(
                rf"^{SUBJECT} (?P<aux>is|are) (?:\w+ly )?(?P<p>stored|kept|saved|written|"
                r"located|installed|placed|cached|recorded|found) (?:in|under|at|inside) \S"
            ),
        ),
        (
            "prose_howto",
            re.compile(
                rf"^(?:To|In order to) {TASK}, (?:you (?:can|should|must|need to|have to) |"
                r"simply |just |first )?(?:use|run|type|set|pass|add|give|specify|call|invoke|edit|"
                r"create|configure|enable|disable|install|put|press|select|click|open|write|"
                r"execute|start|remove|change)\b"
            ),
        ),  # fmt: skip
        (
            "prose_howto",
            re.compile(
                rf"^If you (?:want|need|wish|would like) to {TASK}, (?:then )?(?:you (?:can|"
                r"should|must|need to|have to) )?(?:also )?(?:use|run|type|set|pass|add|give|"
                r"specify|call|edit|create|configure|enable|disable|install)\b"
            ),
        ),  # fmt: skip
        (
            "prose_howto",
            re.compile(
                rf"^You can (?:also |easily |simply )?{TASK} (?:by (?:using|running|setting|"
                r"passing|adding|typing|calling|editing)|with|using) \S"
            ),
        ),  # fmt: skip
        ("prose_howto", re.compile(rf"^Use (?!\w+ing\b)(?P<x>\S+(?: \S+){{0,3}}?) to {TASK}\.$")),
        (
            "prose_condition",
            re.compile(
                rf"^(?P<w>If|When|Unless|After|Before|Once|In case of) (?P<t>[^,;]{{6,90}}), "
                rf"(?:then )?(?P<s>{NAMED}|{CODE}|Git) (?:also |only |then |will |does not |"
                r"do not |can |cannot |never |first )?(?!is\b|are\b|was\b|were\b)[a-z]+"
            ),
        ),
        (
            "prose_option_condition",
            re.compile(
                rf"^(?P<w>If|When) (?P<t>[^,;]*?(?<![\w-]){CODE}[^,;]{{0,60}}), "
                rf"(?:then )?(?:the|a|an|all|no|each|any|only|its|their|Git|git|"
                rf"{CODE}) "
            ),
        ),  # a statement of what happens, not an instruction
        (
            "prose_how",
            re.compile(
                rf"^{SUBJECT} (?P<aux>is|are) (?:\w+ly )?(?P<p>[a-z]+ed|set|built|chosen|given|run|"
                r"written|shown|made|taken|found|read|sent|kept|signaled|signalled) (?:by|with|using|"
                r"through|via|from) \S"
            ),
        ),  # fmt: skip
        (
            "prose_definition",
            re.compile(
                rf"^{SUBJECT} (?:is|are) (?:an?|one of the) (?!(?:{'|'.join(EVALUATIVE)})\b)"
                r"[\w-]+ \S"
            ),
        ),  # fmt: skip
        (
            "prose_behaviour",
            re.compile(
                rf"^(?P<s>{NAMED}|{CODE}) (?!is\b|are\b|has\b|was\b|as\b)(?:also |only |"
                r"then |never |always |first |now )?[a-z]{3,}s\b \S"
            ),
        ),  # fmt: skip
    ],
    "es": [
        (
            "prose_definition",
            re.compile(
                r"^(?P<s>(?:El |La |Los |Las |Un |Una )?[\w-]+(?: [\w-]+){0,3}?) (?:es|son) "
                r"(?:un|una|el|la|los|las) \w+ \S"
            ),
        ),  # fmt: skip
        (
            "prose_meaning",
            re.compile(
                r"^(?P<s>(?:El |La |Los |Las )?[\w-]+(?: [\w-]+){0,3}?) (?:se refiere a|"
                r"significa) \S"
            ),
        ),  # fmt: skip
        (
            "prose_purpose",
            re.compile(
                r"^(?P<s>(?:El |La |Los |Las )?[\w-]+(?: [\w-]+){0,3}?) (?:se usa|se utiliza|"
                r"sirve) para \S"
            ),
        ),  # fmt: skip
        ("prose_enables", re.compile(r"^(?P<s>(?:El |La |Los |Las )?[\w-]+(?: [\w-]+){0,3}?) (?:le )?permiten? \S")),
        (
            "prose_howto",
            re.compile(
                r"^Para (?P<t>[a-záéíóú]+(?:ar|er|ir)(?:l[oa]s?|se)? [^,;:]{4,90}), (?:(?:usted )?"
                r"(?:puede|debe) )?(?:use|utilice|ejecute|escriba|instale|edite|configure|active|"
                r"añada)\b"
            ),
        ),  # fmt: skip
    ],
}
ES_NOT_SUBJECT = _set("""esto este esta estos estas eso ese esa esos esas ello él ella ellos ellas usted lo le
se que cual cuál aquí allí siguiente anterior mismo misma otro otra cada algunos algunas algún alguna cuando si como
para donde porque aunque también todo todos toda todas""")


# ----------------------------------------------------------------------------------------------------------------
# mining


def mine(text: str, lang: str = "en", seed: int = 0, subject: str | None = None) -> list[Mined]:
    """Pairs from the prose of `text` (the cleaned text of one document): at most one per sentence, one per (kind,
    subject) per document. `subject`: what the document is about (its title), for "This command ..." sentences."""
    if lang not in PATTERNS:
        return []
    out: list[Mined] = []
    seen: set[tuple[str, str]] = set()
    proper = proper_nouns(text)
    for number, paragraph in enumerate(re.split(r"\n\s*\n", text)):
        found = sentences(paragraph)
        for i, sentence in enumerate(found):
            if not is_prose(sentence):
                continue
            made = _about_the_document(sentence, number == i == 0, subject, lang, seed)
            made = made or _pair(sentence, lang, seed, proper)
            if made is None and i > 0:
                made = _continued(found[i - 1], sentence, lang, seed, proper)
            if made is None:
                made = _topic(found[i:], lang, seed, proper)
            if made is None:
                continue
            pair, about = made
            if (pair.kind, about.lower()) in seen or not acceptable(pair):
                continue
            seen.add((pair.kind, about.lower()))
            out.append(pair)
    return out


def _continued(previous: str, sentence: str, lang: str, seed: int, proper: frozenset[str]) -> tuple[Mined, str] | None:
    """ "A tag is a name for a commit. It is used to mark releases.": the second sentence, "it" read as the first one's
    subject, asked about that subject and answered by both sentences."""
    if lang != "en" or not re.match(r"^(?:It|They) ", sentence) or not is_prose(previous):
        return None
    m = TOPIC.match(LEAD.sub("", previous))
    subject = (m.group("s") or m.group("n") or "").strip() if m else ""
    if not subject or not good_subject(subject) or (sentence.startswith("It ") and be(subject) == "are"):
        return None
    made = _pair(f"{subject} {sentence.split(' ', 1)[1]}", lang, seed, proper)
    if made is None:
        return None
    pair, about = made
    return Mined(pair.question, f"{previous} {sentence}", pair.kind), about


def _topic(found: list[str], lang: str, seed: int, proper: frozenset[str]) -> tuple[Mined, str] | None:
    """A paragraph of two or more sentences that opens by naming its subject: "What should I know about X?", its
    first sentences the answer."""
    first = LEAD.sub("", found[0])
    m = TOPIC.match(first) if lang == "en" and (len(found) > 1 or len(first.split()) >= TOPIC_MIN_WORDS) else None
    subject = (m.group("s") or m.group("n") or m.group("d") or "").strip() if m else ""
    if not subject or not good_subject(subject):
        return None
    answer = found[0]
    for sentence in found[1:MAX_TOPIC_SENTENCES]:
        if len(answer) + len(sentence) + 1 > MAX_TOPIC_CHARS or not is_prose(sentence):
            break
        answer += " " + sentence
    if (
        not is_code(subject)
        and len(subject.split()) < 2 + subject.lower().startswith(("the ", "a ", "an "))
        and subject not in proper
    ):
        return None  # "Tell me about Client.": one plain word is too vague to ask about out of context, a name is not
    question = questions.ask("prose_topic", lang, seed, subject.lower(), s=shown(subject, proper))
    return Mined(question, answer, "prose_topic"), subject


def is_prose(sentence: str) -> bool:
    """A whole sentence of running text: 6-60 words, capitalised or opening with a name, ends like a sentence,
    balanced brackets and quotes, at most a quarter of its tokens code."""
    words = sentence.split()
    if not MIN_WORDS <= len(words) <= MAX_WORDS or not re.search(r"[.!?][\"')\]]?$", sentence):
        return False
    if sentence.endswith(("...", "…", ":")) or not re.match(rf"[\"'(¿¡]?(?:[A-ZÁÉÍÓÚÑ]|{CODE})", sentence):
        return False
    if sentence.count("(") != sentence.count(")") or sentence.count('"') % 2:
        return False
    code = sum(bool(re.search(r"[<>{}\[\]=|\\;$#]|^-{1,2}\w|\w\(\)", w)) for w in words)
    return code <= MAX_CODE_SHARE * len(words) and not CONTEXT.search(sentence)


def _pair(sentence: str, lang: str, seed: int, proper: frozenset[str]) -> tuple[Mined, str] | None:
    core = LEAD.sub("", sentence) if lang == "en" else sentence
    for kind, pattern in PATTERNS[lang]:
        m = pattern.search(core)
        if m is None:
            continue
        groups = m.groupdict()
        subject = (groups.get("s") or groups.get("n") or "").strip().rstrip(",")
        if subject and not (good_subject(subject) if lang == "en" else _good_es(subject)):
            continue
        task = (groups.get("t") or "").strip()
        if task and (
            re.search(r"\b(?:it|this|that|these|them|they)\b", task)
            or len(task.split()) < 2
            or task.split()[0] in NOT_SUBJECT_WORDS
        ):  # "sometimes come up with ...": no task
            continue
        parts = {"s": shown(subject, proper), "be": be(subject) if subject else "is", "t": task}
        if kind in ("prose_location", "prose_how"):
            parts |= {"aux": m.group("aux"), "p": m.group("p")}
        if kind in ("prose_condition", "prose_option_condition"):
            parts["w"] = m.group("w").lower()
            task = f"{m.group('w').lower()} {task}"
        question = questions.ask(kind, lang, seed, (subject or task).lower(), **parts)
        return Mined(question, sentence, kind), subject or task
    return None


def _about_the_document(sentence: str, first: bool, subject: str | None, lang: str,
                        seed: int) -> tuple[Mined, str] | None:  # fmt: skip
    """ "This command removes ..." or, as its first sentence, "Remove unreachable objects." in a document about
    `git gc`: What does `git gc` do? ("This tool is a ...": What is `git gc`?)"""
    if not subject or lang != "en":
        return None
    m = THIS_SUBJECT.match(sentence)
    if m is None and not (first and SUMMARY.match(sentence)):
        return None
    kind = "prose_definition" if m and m.group("is") else "prose_behaviour"
    question = questions.ask(kind, lang, seed, subject.lower(), s=shown(subject), be="is")
    if kind == "prose_behaviour":
        question = f"What does {shown(subject)} do?"  # the wording that fits a summary in the imperative
    return Mined(question, sentence, kind), subject


def _good_es(subject: str) -> bool:
    words = [w.lower() for w in subject.split()]
    return not any(w in ES_NOT_SUBJECT for w in words) and len(words[-1]) > 2


def acceptable(pair: Mined) -> bool:
    """The answer says something the question does not: MIN_NEW_WORDS content words beyond it."""
    asked = set(re.findall(r"\w+", pair.question.lower()))
    new = {w for w in re.findall(r"\w+", pair.answer.lower()) if w not in asked and len(w) > 2}
    return len(new - NOT_SUBJECT_WORDS) >= MIN_NEW_WORDS


def document_subject(title: str, doc_id: str) -> str | None:
    """What a document is about, for "This command ..." sentences: its title, else its file name when that is a
    name (git-gc.txt -> git-gc; not chapter3.txt, notes_2021.txt or 000123.json)."""
    if title.strip():
        return normalize(title)
    stem = re.sub(r"\.[A-Za-z0-9]+$", "", doc_id.split("#")[0].rsplit("/", 1)[-1])
    if re.fullmatch(r"(?i)(?:doc|document|file|chapter|ch|page|part|section|untitled|index|readme|notes?|text)?"
                    r"[\W\d_]*", stem) or not re.search(r"[A-Za-z]{3}", stem):  # fmt: skip
        return None
    return stem
