"""Q&A pairs from the structure of one reference page, each answer checked against the page's cleaned text.

What a manual holds, and the question its reader asks about it (qtype, then an example of the English wording):

  purpose      a man page's NAME line             "What is `git push` for?"
  description  a DESCRIPTION section, a "Description:" field, the prose after a declaration
                                                  "What does `git push` do?"
  overview     a Summary/Overview/Introduction section, a page's opening prose
                                                  "What is CREATE INDEX about?"
  synopsis     a SYNOPSIS/Syntax section, a "Syntax:" field
                                                  "What is the syntax of the `Alias` directive?"
  declaration  a code block that opens a section by declaring a function
                                                  "How is `sqlite3_open()` declared?"
  option       a defined term that is a command-line option
                                                  "What does the `--force` (`-f`) option of `git push` do?"
  argument     a defined term that is a placeholder ("<repository>", "FILE")
                                                  "What is the `<repository>` argument of `git push`?"
  definition   any other defined term (definition lists, two-column tables)
                                                  "What does `SQLITE_OPEN_READONLY` mean in `sqlite3_open()`?"
  example      a defined term that is a command line of the page's own command
                                                  "What does `git push origin master` do?"
  faq          a heading or term that is itself a question
  details      the prose of a section named after its subject ("Alias Directive")
                                                  "How does the `Alias` directive work?"
  section      the prose under any other heading  "What should I know about “Unique Indexes” in CREATE INDEX?"
  default, context, module, field              the other labelled fields of a property table
                                                  "What is the default value of the `Alias` directive?"

Every answer is the page's own text, and is kept only if it occurs in the data stage's cleaned text of that
document (whitespace-normalised): prose answers are the longest run of whole sentences (at most MAX_SENTENCES,
MAX_ANSWER_CHARS) that does, code answers must occur whole. So an answer is always text of its split, never markup
the data stage dropped or a sentence it cut.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from dataclasses import dataclass

from pretrain.qa import questions as q
from pretrain.qa.structure import Block, Page, Section, words

MAX_SENTENCES = 3
MAX_ANSWER_CHARS = 600
MAX_CODE_CHARS = 800
MIN_ANSWER_WORDS = 4
LEADING_LABELS = 8  # labels and lead-ins skipped before a section's answer ("create-index-stmt:", "expr:", ...)
SHORT_ANSWER_QTYPES = ("default", "context", "module", "field")  # values that repeat by design (many directives)

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_SENTENCE_ENDS = (".", "!", "?", ")", '"', "\u201d", "\u00bb")
_ABBREVIATIONS = ("e.g.", "i.e.", "etc.", "vs.", "cf.", "z.B.", "d.h.", "p.ex.", "c.-à-d.", "Ex.", "ex.")
_NAME_LINE = re.compile(r"^(?P<names>[\w.+:-]+(?:,\s*[\w.+:-]+)*)\s+[-\u2013\u2014]+\s+(?P<purpose>\S.*)$", re.S)
_DECLARED = re.compile(r"^\s*(?:[A-Za-z_][\w \t*&:<>,]*?[\s*&])?([A-Za-z_]\w*)\s*\(", re.M)
_FUNCTION_POINTER = re.compile(r"\(\s*\*\s*([A-Za-z_]\w*)\s*\)\s*\(")  # int (*xRename)(sqlite3_vtab*, ...)
_NOT_DECLARED = {"if", "for", "while", "return", "sizeof", "switch", "void", "int", "char", "long", "short",
                 "unsigned", "signed", "const", "static", "struct", "double", "float"}  # fmt: skip
_MAN_SECTION = re.compile(r"\(\d\w*\)")
# "git-push(1) - Update remote refs", "mod_alias - Apache HTTP Server": name first, then what it is or the site.
# Not " : ", the French colon, which puts the general part first ("Didacticiel Apache : Contenu dynamique avec CGI").
_TITLE_SEPARATORS = re.compile(r"\s+[-|\u2013\u2014]\s+")
_OPTION = re.compile(r"^[-+]{1,2}[\w?\[]")
_PLACEHOLDER = re.compile(r"^<[^>]+>(\.\.\.|\u2026)?$")  # <repository>
_OPTIONS_PLACEHOLDER = re.compile(r"^(\[[^\]]+\]|[A-Z][A-Z0-9_]+)(\.\.\.|\u2026)?$")  # [file], FILE: in OPTIONS
_FIELD_LABEL = re.compile(r"^[^\W\d_]+(?:[ -][^\W\d_]+){0,3}$")  # "Source File", "Module Identifier"
_CODE_CHARS = re.compile(r"[(){}<>\[\]=_@$/\\|]")  # OPT_CALLBACK(short, long, ...), <name>@{upstream}
_FAQ_NUMBER = re.compile(r"^\(?\d+[.)]\s*")
_NOT_CODE_MARKUP = re.compile(r"[`*]")
_MORE_LINK = re.compile(r"(?<=[.!?])\s+[^.!?\s]+(\s[^.!?\s]+)?\s*(\.\.\.|\u2026)$")  # "... request. details ..."


def normalize(text: str) -> str:
    """What answers are matched on: Unicode NFC, every run of whitespace one space."""
    return " ".join(unicodedata.normalize("NFC", text).split())


@dataclass
class Pair:
    question: str
    answer: str
    qtype: str
    heading: str


@dataclass
class Context:
    """What extraction of one page needs besides the page: its cleaned text, language, seed and document id."""

    cleaned: str  # normalize()d cleaned text of the document
    lang: str
    seed: int
    doc_id: str
    title_noise: frozenset[str] = frozenset()  # title segments most pages share (the site's name)


# ----------------------------------------------------------------------------------------------------------------
# answers


def sentences(text: str) -> list[str]:
    out: list[str] = []
    for piece in _SENTENCE_END.split(normalize(text)):
        if out and (piece[:1].islower() or out[-1].endswith(_ABBREVIATIONS)):
            out[-1] += " " + piece
        else:
            out.append(piece)
    return [s for s in out if s]


def prose_answer(paragraphs: list[str], cleaned: str, sentence: bool = True) -> str | None:
    """The longest run of whole sentences from the first substantial paragraph on that occurs in the cleaned text.
    `sentence`: the answer must end like one (a section's prose; a page header or a label does not), which a
    definition ("use a long listing format") need not."""
    paragraphs = [p for p in paragraphs if normalize(p)]
    for _ in range(LEADING_LABELS):
        first = normalize(paragraphs[0]) if paragraphs else ""
        note = len(paragraphs) > 1 and not first.endswith(_SENTENCE_ENDS)  # "Available in httpd 2.4.59 and later"
        if paragraphs and (words(first) < MIN_ANSWER_WORDS or first.endswith(":") or note):
            paragraphs = paragraphs[1:]  # a label ("expr:"), a lead-in to a list, a note that is no sentence
    kept: list[str] = []
    for para in paragraphs[:2]:
        for piece in sentences(para):
            candidate = " ".join([*kept, piece])
            if len(kept) == MAX_SENTENCES or len(candidate) > MAX_ANSWER_CHARS or candidate not in cleaned:
                return _finished(kept, sentence)
            kept.append(piece)
    return _finished(kept, sentence)


def _finished(kept: list[str], sentence: bool) -> str | None:
    while kept and kept[-1].endswith(":"):
        kept = kept[:-1]  # a lead-in to the list or the code that followed it in the page
    answer = _MORE_LINK.sub("", " ".join(kept))
    if words(answer) < MIN_ANSWER_WORDS or (sentence and not answer.endswith(_SENTENCE_ENDS)):
        return None
    return answer


def code_answer(code: str, cleaned: str) -> str | None:
    if not code.strip() or len(code) > MAX_CODE_CHARS or normalize(code) not in cleaned:
        return None
    return code


def value_answer(value: str, cleaned: str) -> str | None:
    value = normalize(value)
    return value if value and len(value) <= MAX_ANSWER_CHARS and value in cleaned else None


# ----------------------------------------------------------------------------------------------------------------
# subjects


def title_noise(titles: list[str], min_share: float = 0.2, min_pages: int = 3) -> frozenset[str]:
    """Title segments ("Apache HTTP Server Version 2.4") that at least `min_share` of the pages carry."""
    counts = Counter(seg for t in titles for seg in set(_TITLE_SEPARATORS.split(t)) if seg)
    floor = max(min_pages, min_share * len(titles))
    return frozenset(seg for seg, n in counts.items() if n >= floor)


def clean_title(title: str, noise: frozenset[str]) -> str:
    title = _MAN_SECTION.sub("", title.replace("Manual Page", "")).strip()
    segments = [s.strip() for s in _TITLE_SEPARATORS.split(title) if s.strip() and s.strip() not in noise]
    return segments[0] if segments else title


def page_subject(page: Page, ctx: Context) -> tuple[str, str | None]:
    """(the subject as a question shows it, the purpose line of a man page's NAME section or None)."""
    purpose = None
    name = None
    for section in page.sections:
        kind = q.section_kind(section.heading)
        if kind == "name" and section.blocks:
            m = _NAME_LINE.match(normalize(section.blocks[0].text))
            if m:
                name, purpose = m.group("names").split(",")[0].strip(), m.group("purpose")
        elif kind == "synopsis" and name and section.blocks:
            # the command as typed: `git push` for the page git-push
            block = section.blocks[0]
            first = _NOT_CODE_MARKUP.sub("", block.term or block.text).replace("'", "").split()
            for k in range(1, min(4, len(first)) + 1):
                if "-".join(first[:k]) == name:
                    name = " ".join(first[:k])
                    break
    title = "" if q.section_kind(page.title) else page.title  # a text page whose first heading is NAME
    subject = name or display_heading(clean_title(title, ctx.title_noise))
    return (f"`{subject}`" if name else q.quote(subject)), purpose


def declared_names(code: str) -> list[str]:
    """The functions a code block declares, in order: `int f(...)`, and the methods of a struct of function pointers
    (`int (*xRename)(...)`); never a C keyword or type."""
    names = []
    for line in code.split("\n"):
        if not line.rstrip().endswith((";", "{", ",", "(", ")")):
            continue  # a declaration ends its line so; prose in a <pre> block ("When it is resolved (e.g. ...") not
        m = _FUNCTION_POINTER.search(line) or _DECLARED.match(line)
        if m and m.group(1) not in names and m.group(1) not in _NOT_DECLARED:
            names.append(m.group(1))
    return names


# ----------------------------------------------------------------------------------------------------------------
# pairs of a page


class _PageExtractor:
    def __init__(self, page: Page, ctx: Context):
        self.page, self.ctx = page, ctx
        self.subject, self.purpose = page_subject(page, ctx)
        self.title = normalize(clean_title(page.title, ctx.title_noise)).lower()
        self.pairs: list[Pair] = []
        self.skipped: Counter[str] = Counter()

    def ask(self, kind: str, key: str, **parts: str) -> str:
        return q.ask(kind, self.ctx.lang, self.ctx.seed, f"{self.ctx.doc_id}\0{key}", **parts)

    def add(self, qtype: str, question: str, answer: str | None, heading: str) -> None:
        if answer is None:
            self.skipped[f"{qtype}: answer not in the cleaned text or too short"] += 1
            return
        self.pairs.append(Pair(question, answer, qtype, heading))

    def run(self) -> tuple[list[Pair], Counter[str]]:
        cleaned = self.ctx.cleaned
        if not self.subject.strip("`"):
            self.skipped["page without a title or name: nothing to ask about"] += 1
            return self.pairs, self.skipped
        for section in self.page.sections:
            kind = q.section_kind(section.heading)
            if kind == "skip":
                continue
            if kind in ("options", "examples"):  # their prose explains the terms and the code around it
                self.fields(section, self.subject)
                self.terms(section, self.subject, options=kind == "options")
                continue
            if kind == "name":
                if self.purpose:
                    question = self.ask("purpose", "name", s=self.subject)
                    answer = value_answer(self.purpose, cleaned) if words(self.purpose) >= 2 else None
                    self.add("purpose", question, answer, section.heading)
                continue
            if kind == "synopsis":
                self.synopsis(section)
                continue
            if kind in ("description", "overview"):
                question = self.ask(kind, section.heading, s=self.subject)
                self.add(kind, question, prose_answer(self.prose(section), cleaned), section.heading)
                self.terms(section, self.subject, options=kind == "description")  # man pages list options there
                continue
            self.general(section)
        return self.pairs, self.skipped

    @staticmethod
    def prose(section: Section) -> list[str]:
        return [b.text for b in section.blocks if b.kind == "prose"]

    def synopsis(self, section: Section) -> None:
        text = "\n".join(b.text if b.kind != "term" else f"{b.term}\n{b.text}" for b in section.blocks)
        question = self.ask("synopsis", section.heading, s=self.subject)
        answer = code_answer(text, self.ctx.cleaned)
        if answer is None:  # a syntax diagram's prose: "The CREATE INDEX command consists of the keywords ..."
            answer = prose_answer(self.prose(section), self.ctx.cleaned)
        self.add("synopsis", question, answer, section.heading)

    def general(self, section: Section) -> None:
        blocks, heading = section.blocks, section.heading
        subject = q.noun_phrase(heading, self.ctx.lang) if heading else None
        if blocks and blocks[0].kind == "code" and (names := declared_names(blocks[0].text)):
            subject = f"`{names[0]}()`"
            question = self.ask("declaration", names[0], s=subject)
            self.add("declaration", question, code_answer(blocks[0].text, self.ctx.cleaned), heading)
            question = self.ask("description", names[0], s=subject)
            self.add("description", question, prose_answer(self.prose(section), self.ctx.cleaned), heading)
            self.terms(section, subject)
            return
        self.fields(section, subject or self.subject)
        self.terms(section, subject or self.subject)
        prose = self.prose(section)
        if not prose:
            return
        answer = prose_answer(prose, self.ctx.cleaned)
        if _is_question(heading):
            self.add("faq", _FAQ_NUMBER.sub("", heading), answer, heading)
        elif subject is not None:
            self.add("details", self.ask("details", heading, s=subject), answer, heading)
        elif not heading or _TITLE_SEPARATORS.split(normalize(heading))[0].lower() in (
            self.title,
            self.subject.strip("`").lower(),
        ):  # the page's own name, maybe with its purpose: "configure - Configure the source tree"
            self.add("overview", self.ask("overview", heading or "top", s=self.subject), answer, heading)
        else:
            shown = display_heading(heading)
            self.add("section", self.ask("section", heading, s=self.subject, h=shown), answer, heading)

    def fields(self, section: Section, subject: str) -> None:
        for block in section.blocks:
            if block.kind != "field":
                continue
            kind = q.field_kind(block.term)
            key = f"{section.heading}\0{block.term}"
            if (kind == "field" and not _FIELD_LABEL.match(block.term)) or not re.search(r"[^\W\d_]", block.text):
                continue  # a table of numbers ("sqlite 2.7.6 (nosync): 0.638"), not a property
            if kind == "description":
                self.add(kind, self.ask(kind, key, s=subject), prose_answer([block.text], self.ctx.cleaned, False),
                         section.heading)  # fmt: skip
            elif kind == "synopsis":
                self.add(kind, self.ask(kind, key, s=subject), value_answer(block.text, self.ctx.cleaned),
                         section.heading)  # fmt: skip
            else:
                question = self.ask(kind, key, s=subject, l=block.term.lower())
                self.add(kind, question, value_answer(block.text, self.ctx.cleaned), section.heading)

    def terms(self, section: Section, subject: str, options: bool = False) -> None:
        for block in section.blocks:
            if block.kind == "term":
                self.term(block, subject, section.heading, options)

    def term(self, block: Block, subject: str, heading: str, options: bool) -> None:
        term = block.term.strip().rstrip(":").strip()
        if not re.search(r"\w", term) or len(term) < 2 or words(term) > 12:
            return
        if term.endswith(".") and words(term) > 3:
            return  # a sentence set as a term (a list of tasks), not a name a reader asks about
        if not re.search(r"[^\W\d_]", term):
            return  # a byte offset ("4..7") or a list number ("6."): the row's description is not about it
        answer = prose_answer([block.text], self.ctx.cleaned, sentence=False)
        bare = term.strip("`'\"")
        command = self.subject.strip("`")
        if _is_question(term):
            self.add("faq", _FAQ_NUMBER.sub("", term), answer, heading)
        elif block.term.strip().endswith(":") and _FIELD_LABEL.match(bare) and words(bare) <= 2 and heading:
            # a label of a recipe ("Description:", "Solution:"): about the section, not the word
            shown = f"{display_heading(heading)}: {bare}"
            self.add("section", self.ask("section", f"{heading}\0{term}", s=subject, h=shown), answer, heading)
        elif _OPTION.match(bare):
            self.add("option", self.ask("option", term, t=option_display(bare), s=subject), answer, heading)
        elif _PLACEHOLDER.match(bare) or (options and _OPTIONS_PLACEHOLDER.match(bare)):
            self.add("argument", self.ask("argument", term, t=f"`{bare}`", s=subject), answer, heading)
        elif command and " " in bare and bare.startswith(command + " "):
            self.add("example", self.ask("description", term, s=f"`{bare}`"), answer, heading)
        elif q.looks_like_code(bare) or _CODE_CHARS.search(bare) or words(bare) <= 3:
            code = q.looks_like_code(bare) or _CODE_CHARS.search(bare)
            shown = f"`{bare}`" if code and "`" not in bare else f"\u201c{bare}\u201d"
            self.add("definition", self.ask("definition", term, t=shown, s=subject), answer, heading)
        else:  # a title-like term ("Rewriting URLs with mod_rewrite"): a topic of the page, not a word to define
            self.add("section", self.ask("section", term, s=subject, h=bare), answer, heading)


def _is_question(text: str) -> bool:
    """A heading or term that is itself the reader's question ("How can I ...? I still want ...")."""
    return text.endswith("?") or "? " in text


def display_heading(heading: str) -> str:
    """A heading as it reads inside a question: "SECURITY" -> "Security" (man pages shout their section names), but
    a name stays as written ("QUERY_STRING", "HTTP2")."""
    if heading.isupper() and len(heading) > 4 and re.fullmatch(r"[^\W\d_]+( [^\W\d_]+)*", heading):
        return heading[0] + heading[1:].lower()
    return heading


def option_display(term: str) -> str:
    """'-f, --force' -> '`--force` (`-f`)': the long form first, as a reader names the option."""
    forms = [f.strip() for f in re.split(r",\s*|\s+\|\s+", term) if f.strip()]
    if len(forms) == 1:
        return f"`{forms[0]}`"
    primary = max(forms, key=lambda f: (f.startswith("--"), len(f)))
    others = [f for f in forms if f != primary]
    return f"`{primary}` (" + ", ".join(f"`{f}`" for f in others) + ")"


def page_pairs(page: Page, ctx: Context) -> tuple[list[Pair], Counter[str]]:
    """Every pair of a page whose answer is in its cleaned text, and the count of candidates skipped, by reason."""
    return _PageExtractor(page, ctx).run()
