"""How a reader of a manual asks about what a page documents, per language: question wordings and section names.

Every kind of pair has a few wordings; `ask` picks one by a stable hash of the seed and what is asked about, so the
set is varied but the same on every run. Languages without their own entry are asked in English (the answers stay
in the corpus's own words either way). `{s}` is the subject (a command, function, statement, page), `{t}` a term or
option, `{h}` a section heading, `{l}` a field label.
"""

from __future__ import annotations

import re

import xxhash

WORDINGS: dict[str, dict[str, list[str]]] = {
    "en": {
        "purpose": ["What is {s} for?", "What is {s} used for?", "In one line, what does {s} do?"],
        "description": ["What does {s} do?", "Describe {s}.", "What is {s}?"],
        "overview": ["What is {s} about?", "Give an overview of {s}.", "What does the documentation of {s} cover?"],
        "synopsis": ["What is the syntax of {s}?", "Show the synopsis of {s}.", "How do I write a call to {s}?"],
        "declaration": ["How is {s} declared?", "What is the declaration of {s}?", "What is the signature of {s}?"],
        "option": [
            "What does the {t} option of {s} do?",
            "What is the {t} option of {s} for?",
            "Explain the {t} option of {s}.",
        ],
        "argument": [
            "What is the {t} argument of {s}?",
            "What should I pass as {t} to {s}?",
            "What does {t} mean for {s}?",
        ],
        "definition": ["What does {t} mean in {s}?", "What is {t} in {s}?", "In {s}, what is meant by {t}?"],
        "details": ["How does {s} work?", "What should I know about {s}?", "Tell me more about {s}."],
        "section": [
            "What does the documentation of {s} say about “{h}”?",
            "What should I know about “{h}” in {s}?",
            "Explain “{h}” in {s}.",
        ],
        "default": ["What is the default value of {s}?", "What is {s} set to by default?"],
        "context": ["Where can {s} be used?", "In which contexts is {s} allowed?"],
        "module": ["Which module provides {s}?", "What module do I need for {s}?"],
        "field": ["What is the {l} of {s}?", "What does the documentation give as the {l} of {s}?"],
    },
    "fr": {
        "purpose": ["À quoi sert {s} ?", "En une ligne, que fait {s} ?"],
        "description": ["Que fait {s} ?", "Décrivez {s}.", "Qu'est-ce que {s} ?"],
        "overview": ["De quoi traite {s} ?", "Présentez {s}.", "Que couvre la documentation de {s} ?"],
        "synopsis": ["Quelle est la syntaxe de {s} ?", "Donnez le synopsis de {s}.", "Comment s'écrit {s} ?"],
        "declaration": ["Comment déclare-t-on {s} ?", "Quelle est la déclaration de {s} ?"],
        "option": [
            "Que fait l'option {t} de {s} ?",
            "À quoi sert l'option {t} de {s} ?",
            "Expliquez l'option {t} de {s}.",
        ],
        "argument": ["Qu'est-ce que l'argument {t} de {s} ?", "Que faut-il passer comme {t} à {s} ?"],
        "definition": ["Que signifie {t} dans {s} ?", "Qu'est-ce que {t} dans {s} ?"],
        "details": ["Comment fonctionne {s} ?", "Que faut-il savoir sur {s} ?", "Parlez-moi de {s}."],
        "section": [
            "Que dit la documentation de {s} sur « {h} » ?",
            "Que faut-il savoir sur « {h} » dans {s} ?",
            "Expliquez « {h} » dans {s}.",
        ],
        "default": ["Quelle est la valeur par défaut de {s} ?", "Que vaut {s} par défaut ?"],
        "context": ["Où peut-on utiliser {s} ?", "Dans quels contextes peut-on utiliser {s} ?"],
        "module": ["Quel module fournit {s} ?", "De quel module ai-je besoin pour {s} ?"],
        "field": ["Que donne la documentation comme « {l} » pour {s} ?", "Quel est le champ « {l} » de {s} ?"],
    },
    "de": {
        "purpose": ["Wofür ist {s} da?", "Wozu dient {s}?"],
        "description": ["Was macht {s}?", "Beschreibe {s}.", "Was ist {s}?"],
        "overview": ["Worum geht es bei {s}?", "Gib einen Überblick über {s}."],
        "synopsis": ["Wie lautet die Syntax von {s}?", "Zeige die Übersicht von {s}."],
        "declaration": ["Wie ist {s} deklariert?", "Wie lautet die Deklaration von {s}?"],
        "option": ["Was bewirkt die Option {t} von {s}?", "Wofür ist die Option {t} von {s}?"],
        "argument": ["Was ist das Argument {t} von {s}?", "Was übergebe ich als {t} an {s}?"],
        "definition": ["Was bedeutet {t} in {s}?", "Was ist {t} in {s}?"],
        "details": ["Wie funktioniert {s}?", "Was sollte ich über {s} wissen?"],
        "section": ["Was sagt die Dokumentation von {s} über „{h}“?", "Was sollte ich über „{h}“ in {s} wissen?"],
        "default": ["Was ist der Standardwert von {s}?", "Worauf steht {s} standardmäßig?"],
        "context": ["Wo kann {s} verwendet werden?", "In welchen Kontexten ist {s} erlaubt?"],
        "module": ["Welches Modul stellt {s} bereit?", "Welches Modul brauche ich für {s}?"],
        "field": ["Was gibt die Dokumentation als „{l}“ von {s} an?"],
    },
}

# Section headings by what their section holds (lowercase; the languages above plus common variants).
SECTION_NAMES: dict[str, set[str]] = {
    "name": {"name", "nom"},
    "synopsis": {
        "synopsis",
        "syntax",
        "usage",
        "signature",
        "declaration",
        "syntaxe",
        "utilisation",
        "übersicht",
        "aufruf",
        "verwendung",
    },
    "description": {"description", "beschreibung"},
    "options": {
        "options",
        "parameters",
        "arguments",
        "flags",
        "command-line options",
        "command line options",
        "optionen",
        "paramètres",
        "parameter",
        "argumente",
    },
    "overview": {
        "summary",
        "overview",
        "introduction",
        "about",
        "résumé",
        "présentation",
        "aperçu",
        "einleitung",
        "überblick",
        "zusammenfassung",
        "einführung",
    },
    "examples": {"examples", "example", "exemples", "exemple", "beispiele", "beispiel"},
    "skip": {
        "see also",
        "voir aussi",
        "siehe auch",
        "author",
        "authors",
        "auteur",
        "auteurs",
        "autor",
        "autoren",
        "bugs",
        "reporting bugs",
        "bogues",
        "copyright",
        "license",
        "licence",
        "lizenz",
        "table of contents",
        "contents",
        "sommaire",
        "inhalt",
        "inhaltsverzeichnis",
        "index",
        "footnotes",
        "notes de bas de page",
    },
}

# Field labels (two-column property tables) by the question they answer.
FIELD_LABELS: dict[str, set[str]] = {
    "description": {"description", "beschreibung"},
    "synopsis": {"syntax", "syntaxe", "usage", "signature"},
    "default": {"default", "défaut", "valeur par défaut", "voreinstellung", "standard", "default value"},
    "context": {"context", "contexte", "kontext"},
    "module": {"module", "modul"},
}

# "Alias Directive" -> "the `Alias` directive": the nouns a reference page names its subject with, per language.
SUBJECT_NOUNS: dict[str, dict[str, str]] = {
    "en": {
        n: "the"
        for n in (
            "directive",
            "module",
            "command",
            "function",
            "option",
            "statement",
            "pragma",
            "filter",
            "provider",
            "macro",
            "keyword",
            "variable",
            "setting",
            "program",
            "tool",
        )
    },
    "fr": {
        "directive": "la",
        "module": "le",
        "commande": "la",
        "fonction": "la",
        "option": "l'",
        "programme": "le",
        "filtre": "le",
        "variable": "la",
        "instruction": "l'",
    },
    "de": {
        "direktive": "die",
        "modul": "das",
        "befehl": "der",
        "funktion": "die",
        "option": "die",
        "programm": "das",
        "filter": "der",
        "variable": "die",
    },
}


# Questions about a sentence of running text (prose.py), per language with mining patterns. {s} the subject, {be}
# is/are agreeing with it, {t} a task or a condition, {w} if/when, {aux} is/are and {p} a participle.
PROSE_WORDINGS: dict[str, dict[str, list[str]]] = {
    "en": {
        "prose_definition": ["What {be} {s}?", "What is meant by {s}?", "Define {s}."],
        "prose_meaning": ["What does {s} mean?", "What does {s} refer to?", "What is meant by {s}?"],
        "prose_purpose": ["What {be} {s} used for?", "What is the purpose of {s}?", "What {be} {s} for?"],
        "prose_enables": ["What does {s} let you do?", "What can you do with {s}?"],
        "prose_default": ["What does {s} do by default?", "What is the default behaviour of {s}?"],
        "prose_default_np": ["What is the default for {s}?", "What happens to {s} by default?"],
        "prose_default_to": ["What does {s} default to?", "What is the default of {s}?"],
        "prose_location": ["Where {aux} {s} {p}?"],
        "prose_howto": ["How do I {t}?", "How can I {t}?", "What should I do to {t}?"],
        "prose_condition": ["What does {s} do {w} {t}?", "How does {s} behave {w} {t}?"],
        "prose_option_condition": ["What happens {w} {t}?"],
        "prose_how": ["How {aux} {s} {p}?"],
        "prose_behaviour": ["What does {s} do?", "What is the effect of {s}?"],
        "prose_topic": [
            "What should I know about {s}?",
            "Tell me about {s}.",
            "What does the documentation say about {s}?",
        ],
    },
    "es": {
        "prose_definition": ["¿Qué es {s}?", "¿Qué se entiende por {s}?"],
        "prose_meaning": ["¿Qué significa {s}?", "¿A qué se refiere {s}?"],
        "prose_purpose": ["¿Para qué se usa {s}?", "¿Para qué sirve {s}?"],
        "prose_enables": ["¿Qué permite hacer {s}?", "¿Qué se puede hacer con {s}?"],
        "prose_howto": ["¿Cómo se puede {t}?", "¿Qué hay que hacer para {t}?"],
    },
}


def language_of(lang: str | None) -> str:
    return lang if lang in WORDINGS else "en"


def ask(kind: str, lang: str, seed: int, key: str, **parts: str) -> str:
    """One wording of a `kind` question in `lang`, chosen by a stable hash of (seed, kind, key)."""
    table = PROSE_WORDINGS if kind.startswith("prose_") else WORDINGS
    options = table[lang if lang in table else "en"][kind]
    choice = xxhash.xxh64_intdigest(f"{kind}\0{key}".encode(), seed=seed & 0xFFFFFFFFFFFFFFFF) % len(options)
    return options[choice].format(**parts)


def section_kind(heading: str) -> str | None:
    name = heading.strip().lower()
    return next((kind for kind, names in SECTION_NAMES.items() if name in names), None)


def field_kind(label: str) -> str:
    name = " ".join(label.lower().split())
    return next((kind for kind, names in FIELD_LABELS.items() if name in names), "field")


def looks_like_code(text: str) -> bool:
    """A name a user would type: an identifier, a path, an option, a call (no spaces, or a short lowercase command)."""
    if not text or len(text) > 80:
        return False
    if " " not in text:
        return bool(re.search(r"[_.()<>=/:\-]|^[a-z0-9]+$|[a-z][A-Z]", text))
    return bool(re.fullmatch(r"[a-z][\w.-]*( [a-z][\w.-]*){1,2}", text))


def quote(text: str) -> str:
    return f"`{text}`" if looks_like_code(text) and "`" not in text else text


NOT_NAMES = {
    "the",
    "a",
    "an",
    "this",
    "that",
    "your",
    "our",
    "its",
    "of",
    "for",
    "le",
    "la",
    "les",
    "un",
    "une",
    "de",
    "du",
    "des",
    "pour",
    "der",
    "die",
    "das",
    "ein",
    "eine",
    "für",
    "von",
}


def noun_phrase(heading: str, lang: str) -> str | None:
    """'Alias Directive' -> 'the `Alias` directive', 'Apache Module mod_alias' -> 'the `mod_alias` module' (and the
    French and German forms); None when the heading is not of that shape."""
    lang = language_of(lang)
    nouns = SUBJECT_NOUNS[lang]
    parts = heading.split()
    if len(parts) > 3:
        return None  # "Building MPMs as DSO modules" is about something, not the name of it
    if lang == "de" and parts and "-" in parts[-1]:  # "Alias-Direktive"
        name, _, noun = parts[-1].rpartition("-")
        if noun.lower() in nouns and name:
            return f"{nouns[noun.lower()]} {noun.capitalize()} `{name}`"
    if len(parts) < 2:
        return None
    for noun_at, name_at in ((-1, -2), (-2, -1)):  # "Alias Directive"; "Module mod_alias", "Directive Alias"
        noun, name = parts[noun_at].lower(), parts[name_at]
        if lang == "en" and noun_at == -2 and not looks_like_code(name):
            continue  # English names after the noun only what is typed ("Module mod_alias"): "Module Enhancements"
        if noun in nouns and name.lower() not in NOT_NAMES and name.lower() not in nouns:
            if lang == "en":
                return f"the `{name}` {noun}"
            article = nouns[noun]
            shown = noun.capitalize() if lang == "de" else noun
            return f"{article}{'' if article.endswith(chr(39)) else ' '}{shown} `{name}`"
    return None
