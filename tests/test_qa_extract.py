"""Q&A extraction from document structure, pinned on small synthetic pages: a rendered man page, an HTML reference
page with a definition list and tables, a Markdown guide. Every answer must be text of the page's cleaned text."""

from __future__ import annotations

from pretrain.qa.extract import (
    Context,
    clean_title,
    normalize,
    option_display,
    page_pairs,
    prose_answer,
    title_noise,
)
from pretrain.qa.structure import parse_html, parse_text

MAN_PAGE = """\
LS(1)                            User Commands                           LS(1)

NAME
       ls - list directory contents

SYNOPSIS
       ls [OPTION]... [FILE]...

DESCRIPTION
       List information about the FILEs (the current directory by default).
       Sort entries alphabetically if none of -cftuvSUX nor --sort is specified.

       -a, --all
              do not ignore entries starting with .

       -l     use a long listing format

       FILE   a file or directory to list

SEE ALSO
       Full documentation at the project's web site, or available locally.
"""

HTML_PAGE = """\
<html><head><title>frobctl - Widget Manual</title></head><body>
<nav><a href="/">Home</a> | <a href="/docs">Documentation</a></nav>
<h1>frobctl</h1>
<h2>1. Synopsis</h2><pre>frobctl [--force] [--level=N] FILE</pre>
<h2>2. Description</h2>
<p>The <code>frobctl</code> command frobnicates the widgets listed in FILE. It never touches the originals.</p>
<h2>3. Options</h2>
<dl><dt>--force</dt><dd><p>Overwrite an existing output file without asking first.</p></dd>
<dt>-l N</dt><dt>--level=N</dt><dd>Set the compression level, from 1 to 9.</dd></dl>
<h2>4. Settings</h2>
<table><tr><th>Setting</th><th>Meaning</th></tr>
<tr><td>frob.color</td><td>The colour used for widgets that have no colour of their own.</td></tr></table>
<h2>Level Directive</h2>
<table class="directive"><tr><th>Default:</th><td>Level 6</td></tr><tr><th>Module:</th><td>mod_frob</td></tr></table>
<p>The Level directive sets how hard frobctl works on each widget it reads.</p>
<h2>5. Exit Status</h2><p>frobctl exits with status 0 on success and 1 when a widget could not be read.</p>
<h2>See also</h2><p>The widget reference manual, which lists all the widget types.</p>
</body></html>
"""

# What the data stage's HTML extraction kept of it: no navigation, no headings, the inline <code> dropped from the
# description (so its first sentence is not the page's text any more), the exit status paragraph gone.
HTML_CLEANED = """\
frobctl [--force] [--level=N] FILE
The command frobnicates the widgets listed in FILE. It never touches the originals.
Overwrite an existing output file without asking first.
Set the compression level, from 1 to 9.
| Setting | Meaning |
| frob.color | The colour used for widgets that have no colour of their own. |
| Default: | Level 6 |
| Module: | mod_frob |
The Level directive sets how hard frobctl works on each widget it reads.
The widget reference manual, which lists all the widget types.
"""

MARKDOWN_PAGE = """\
# Widget Guide

Widgets are small reusable parts of a frob configuration. Each widget has a name and a version.

## Installing widgets

Run `frobctl install NAME` to install a widget from the catalogue. Installed widgets live in your home directory.

## Why do widgets fail to load?

A widget fails to load when its manifest names a frob version newer than the one installed.

Catalogue
: The list of widgets that frobctl can install, refreshed every night.

```sh
frobctl install clock
```
"""


def pairs_of(page, cleaned: str, lang: str = "en", seed: int = 1):
    pairs, skipped = page_pairs(page, Context(normalize(cleaned), lang, seed, "doc"))
    return {(p.qtype, p.question): p.answer for p in pairs}, skipped


def test_a_man_page_gives_purpose_synopsis_description_and_options():
    pairs, _ = pairs_of(parse_text(MAN_PAGE), MAN_PAGE)
    by_type = {}
    for (qtype, question), answer in pairs.items():
        by_type.setdefault(qtype, []).append((question, answer))
    assert by_type["purpose"] == [(by_type["purpose"][0][0], "list directory contents")]
    assert "`ls`" in by_type["purpose"][0][0]
    assert [a for _, a in by_type["synopsis"]] == ["ls [OPTION]... [FILE]..."]
    assert [a for _, a in by_type["description"]] == [
        "List information about the FILEs (the current directory by default). Sort entries alphabetically if none "
        "of -cftuvSUX nor --sort is specified."
    ]
    options = dict(by_type["option"])
    assert sorted(options.values()) == ["do not ignore entries starting with .", "use a long listing format"]
    assert any("`--all` (`-a`)" in q and "`ls`" in q for q in options)
    # a capitals placeholder in an options list is an argument; SEE ALSO gives nothing
    assert [a for _, a in by_type["argument"]] == ["a file or directory to list"]
    assert not any("documentation" in a for a in pairs.values())


def test_an_html_reference_page_keeps_only_answers_the_cleaned_text_holds():
    page = parse_html(HTML_PAGE)
    pairs, skipped = pairs_of(page, HTML_CLEANED)
    answers = {qtype: [] for qtype, _ in pairs}
    for (qtype, _), answer in pairs.items():
        answers[qtype].append(answer)
    assert answers["synopsis"] == ["frobctl [--force] [--level=N] FILE"]
    assert sorted(answers["option"]) == ["Overwrite an existing output file without asking first.",
                                         "Set the compression level, from 1 to 9."]  # fmt: skip
    assert answers["definition"] == ["The colour used for widgets that have no colour of their own."]
    assert answers["default"] == ["Level 6"] and answers["module"] == ["mod_frob"]
    assert answers["details"] == ["The Level directive sets how hard frobctl works on each widget it reads."]
    questions = set(q for _, q in pairs)
    assert any("the `--level=N` (`-l N`) option of `frobctl`" in q for q in questions)
    assert any("the `Level` directive" in q for q in questions)  # "Level Directive": the subject of its fields
    # the description lost its inline <code> in extraction: its first sentence is not the document's text any more,
    # so no description pair; the exit status paragraph was dropped entirely; "See also" is never asked about
    assert "description" not in answers and not any("exits with status" in a for a in pairs.values())
    assert skipped["description: answer not in the cleaned text or too short"] == 1
    assert not any("reference manual" in a for a in pairs.values())
    # with the whole text kept, the same page gives both
    full, _ = pairs_of(page, HTML_CLEANED + "\nThe frobctl command frobnicates the widgets listed in FILE.\n"
                       "frobctl exits with status 0 on success and 1 when a widget could not be read.")  # fmt: skip
    assert {a for (t, _), a in full.items() if t in ("description", "section")} == {
        "The frobctl command frobnicates the widgets listed in FILE.",
        "frobctl exits with status 0 on success and 1 when a widget could not be read.",
    }


def test_a_markdown_page_gives_overview_sections_faq_and_definitions():
    pairs, _ = pairs_of(parse_text(MARKDOWN_PAGE), MARKDOWN_PAGE)
    assert pairs[("faq", "Why do widgets fail to load?")] == (
        "A widget fails to load when its manifest names a frob version newer than the one installed."
    )
    kinds = {qtype: (q, a) for (qtype, q), a in pairs.items()}
    assert (
        kinds["overview"][1].startswith("Widgets are small reusable parts") and "Widget Guide" in kinds["overview"][0]
    )
    assert "Installing widgets" in kinds["section"][0] and kinds["section"][1].startswith("Run `frobctl install NAME`")
    assert kinds["definition"][1] == "The list of widgets that frobctl can install, refreshed every night."
    assert "install clock" not in " ".join(pairs.values())  # code outside a synopsis is not an answer


def test_answers_are_whole_sentences_of_the_cleaned_text():
    cleaned = normalize("First sentence is kept here. Second one too, e.g. this. Third not in the text.")
    paragraphs = ["First sentence is kept here. Second one too, e.g. this. Third is different."]
    assert prose_answer(paragraphs, cleaned) == "First sentence is kept here. Second one too, e.g. this."
    assert prose_answer(["Nothing of this is there at all."], cleaned) is None
    assert prose_answer(["Too short."], "Too short.") is None  # fewer than 4 words teach nothing


def test_questions_are_deterministic_and_in_the_documents_language():
    page = parse_html(HTML_PAGE)
    one, _ = pairs_of(page, HTML_CLEANED, seed=7)
    again, _ = pairs_of(parse_html(HTML_PAGE), HTML_CLEANED, seed=7)
    assert one == again
    french = HTML_PAGE.replace("Level Directive", "Directive Level").replace("Default:", "Défaut:")
    fr, _ = pairs_of(parse_html(french), HTML_CLEANED.replace("Default:", "Défaut:"), lang="fr")
    questions = [q for _, q in fr]
    assert any("la directive `Level`" in q and q.endswith(" ?") for q in questions)
    assert any(q.startswith(("Que fait l'option", "À quoi sert l'option", "Expliquez l'option")) for q in questions)


def test_site_title_segments_are_not_subjects():
    titles = [f"page {i} - Apache HTTP Server Version 2.4" for i in range(10)] + ["Other"]
    assert title_noise(titles) == frozenset({"Apache HTTP Server Version 2.4"})
    assert option_display("-f, --force") == "`--force` (`-f`)" and option_display("--all") == "`--all`"


# What reading samples of real manuals turned up (SQLite's C reference, Apache's pages in English and French): each
# was a question a reader would not ask, or an answer with a stray piece, before the rule that now handles it.
QUIRKS_PAGE = """\
<html><head><title>Virtual Table Methods - SQLite</title></head><body>
<h2>The xRename Method</h2>
<pre>int (*xRename)(sqlite3_vtab *pVtab, const char *zNew);</pre>
<p>This method tells the virtual table implementation that the table will be given a new name.</p>
<h2>QUERY_STRING</h2>
<p><em>Available in httpd 2.4.59 and later</em></p>
<p>The variable holds whatever follows the question mark of the requested URL.</p>
<h2>Module Enhancements</h2>
<table><tr><td>mod_proxy</td><td>The proxy module was completely rewritten for this release. details ...</td></tr>
<tr><td>4..7</td><td>Unused padding space, which must be zero.</td></tr></table>
<h2>Conflicts</h2>
<pre>When a conflict is resolved (e.g. with "git add path"), these
higher stage entries are removed.</pre>
</body></html>
"""
PROGRAM_PAGE = """\
<html><head><title>configure - Configure the source tree - Apache HTTP Server</title></head><body>
<h1>configure - Configure the source tree</h1>
<p>The configure script configures the source tree for compiling the server on your platform.</p>
</body></html>
"""


def test_what_real_manuals_showed_is_asked_and_answered_as_a_reader_would():
    page = parse_html(QUIRKS_PAGE)
    cleaned = " ".join(b.text for s in page.sections for b in s.blocks)
    pairs, _ = pairs_of(page, cleaned)
    questions = {qtype: [(q, a) for (t, q), a in pairs.items() if t == qtype] for qtype, _ in pairs}
    # the function pointer's name is the function, not its return type
    assert [q for q, _ in questions["declaration"] + questions["description"]] == [
        "What is the declaration of `xRename()`?", "What does `xRename()` do?"]  # fmt: skip
    # a name in capitals stays as written; a note that is no sentence is not part of the answer
    assert questions["section"] == [
        (
            "What should I know about \u201cQUERY_STRING\u201d in Virtual Table Methods?",
            "The variable holds whatever follows the question mark of the requested URL.",
        )
    ]
    # "Module Enhancements" names no module; a "details ..." link after the answer is not part of it; a byte offset
    # names nothing; prose in a <pre> block declares no function
    assert questions["definition"] == [("In Virtual Table Methods, what is meant by `mod_proxy`?",
                                        "The proxy module was completely rewritten for this release.")]  # fmt: skip
    # the page's own name with its purpose heading a section: the page's overview
    page = parse_html(PROGRAM_PAGE)
    pairs, _ = pairs_of(page, " ".join(b.text for s in page.sections for b in s.blocks))
    assert [(t, q) for t, q in pairs] == [("overview", "Give an overview of `configure`.")]
    # a French title keeps what follows its colon (the general part comes first there)
    titles = ["Didacticiel Apache : Contenu dynamique avec CGI - Serveur HTTP Apache"] * 1 + [
        f"page {i} - Serveur HTTP Apache" for i in range(9)]  # fmt: skip
    assert clean_title(titles[0], title_noise(titles)) == "Didacticiel Apache : Contenu dynamique avec CGI"


def test_a_utf8_page_without_a_charset_declaration_keeps_its_letters():
    page = parse_html("<html><body><h1>Löschen</h1><p>Die Datei wird gelöscht, wenn sie älter ist.</p></body></html>")
    assert page.title == "Löschen"
    assert [b.text for s in page.sections for b in s.blocks] == ["Die Datei wird gelöscht, wenn sie älter ist."]
