"""What a word is, per script: the one place the data stage's rules, its token estimate and the Q&A stage count words.

Text with spaces between words is split on whitespace (an identifier such as mount(8) stays one token). Chinese and
Japanese are written without spaces: each run of their characters is cut by a word segmenter chosen by language, as
FineWeb-2 and datatrove do (rjieba for Chinese, SudachiPy in mode A, short units, for Japanese; both MIT/Apache,
`pip install 'forge-slm[cjk]'`). Without them a run is cut into 2-character chunks, which measured almost as good
for telling prose from code (96% agreement with the English manual's lines, against 67-72% for whitespace; the
figures are in the README's data section). A language written without spaces that no segmenter is known for (Thai,
Lao, Khmer, Burmese, Tibetan) gets no word count at all: `segmented(lang)` is False and the word-based quality rules
skip its documents, which the data report says.

    segment("使用软件包管理系统安装软件。", "zh")   # ['使用', '软件包', '管理系统', '安装', '软件']
    est_tokens(text)                                  # words x 1.3 + Chinese characters x 1.0 + Japanese x 0.7
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable

_CJK = r"\u3005\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f"  # 々, kana, Han, half-width kana
_CJK_PUNCT = r"\u3000-\u3004\u3006-\u303f\uff01-\uff0f\uff1a-\uff20\uff3b-\uff40\uff5b-\uff65\u30fb"
_RUN = re.compile(rf"([{_CJK}{_CJK_PUNCT}]+)")
_HAS_CJK = re.compile(f"[{_CJK}]")
_KANA = re.compile(r"[\u3040-\u30ff\uff66-\uff9f]")
_PUNCT_ONLY = re.compile(r"^[\W_]+$")
_PUNCT_SPLIT = re.compile(rf"[{_CJK_PUNCT}]+")
# Scripts written without spaces between words that have no segmenter here: Thai, Lao, Tibetan, Myanmar, Khmer.
_UNSEGMENTED_SCRIPT = re.compile(r"[\u0e00-\u0eff\u0f00-\u0fff\u1000-\u109f\u1780-\u17ff]")
UNSEGMENTED_LANGUAGES = frozenset({"th", "lo", "bo", "dz", "my", "km"})
CJK_LANGUAGES = frozenset({"zh", "ja", "wuu", "yue"})  # fastText's lid.176 labels (no zh-cn: it is "zh")

TOKENS_PER_WORD = 1.3  # a byte-level BPE trained on the domain, English; the tokenizer stage warns above 1.4
# Measured with byte-level BPE tokenizers (8k and 32k) trained on the Debian Reference in each language: 1.8-2.1
# Chinese and 2.3-2.7 Japanese characters per token, so ~1.0 and ~0.7 tokens per character (lower bounds: a
# tokenizer trained on the text itself).
TOKENS_PER_HAN_CHAR = 1.0
TOKENS_PER_JAPANESE_CHAR = 0.7
CHUNK = 2  # characters per "word" where no segmenter is installed


def has_cjk(text: str) -> bool:
    return _HAS_CJK.search(text) is not None


def cjk_chars(text: str) -> int:
    return len(_HAS_CJK.findall(text))


def cjk_language(text: str, hint: str | None = None) -> str:
    """zh or ja for a text holding CJK characters: kana make it Japanese; Han alone is the hint's (when it is zh or
    ja), else Chinese."""
    if _KANA.search(text):
        return "ja"
    return hint if hint in ("zh", "ja") else "zh"


def segmented(lang: str) -> bool:
    """Whether words can be counted in this language (False: written without spaces and no segmenter known)."""
    return lang not in UNSEGMENTED_LANGUAGES


def unsegmented_script(text: str) -> bool:
    return _UNSEGMENTED_SCRIPT.search(text) is not None


@functools.cache
def segmenter(lang: str) -> tuple[str, Callable[[str], list[str]] | None]:
    """(name, function cutting a CJK run into words) for zh or ja; ("2-char chunks", None) without the library."""
    try:
        if lang == "ja":
            from sudachipy import Dictionary, SplitMode  # Apache-2.0, with sudachidict-core (Apache-2.0)

            tokenizer = Dictionary(dict="core").tokenizer(SplitMode.A)  # mode A: short units, as datatrove uses
            return "sudachipy (mode A)", lambda s: [m.surface() for m in tokenizer.tokenize(s)]
        import rjieba  # MIT: jieba's dictionary and algorithm in Rust, no cache file

        return "rjieba", rjieba.cut
    except ImportError:
        return f"{CHUNK}-char chunks (no segmenter: pip install 'forge-slm[cjk]')", None


def segmenter_name(lang: str) -> str:
    """How words of `lang` are found, for the report."""
    if lang in CJK_LANGUAGES:
        return segmenter("ja" if lang == "ja" else "zh")[0]
    return "whitespace" if segmented(lang) else "none: word-based rules skipped"


def segment(text: str, lang: str | None = None) -> list[str]:
    """The words (and other tokens) of `text`: whitespace tokens, each CJK run cut into words, punctuation-only pieces
    of CJK text dropped. `lang` picks the segmenter for Han-only runs (kana always mean Japanese)."""
    out: list[str] = []
    for token in text.split():
        if not _HAS_CJK.search(token):
            out.append(token)
            continue
        for part in _RUN.split(token):
            if not part:
                continue
            if not _HAS_CJK.search(part):  # an ASCII piece glued to CJK: 运行mount(8)。 -> mount(8)
                if not _PUNCT_ONLY.match(part):
                    out.append(part)
                continue
            out.extend(_cut(part, cjk_language(part, lang)))
    return out


def _cut(run: str, lang: str) -> list[str]:
    cut = segmenter(lang)[1]
    words: list[str] = []
    for i in range(0, len(run), 20_000):  # SudachiPy refuses inputs over ~49 KB
        piece = run[i : i + 20_000]
        if cut is None:
            parts = _PUNCT_SPLIT.split(piece)
            words += [p[k : k + CHUNK] for p in parts for k in range(0, len(p), CHUNK)]
        else:
            words += cut(piece)
    return [w for w in words if w.strip() and not _PUNCT_ONLY.match(w)]


def est_tokens(text: str) -> int:
    """Tokens a byte-level BPE trained on the domain would give, before one exists: whitespace words x 1.3, plus
    per CJK character 1.0 (Chinese) or 0.7 (Japanese: text with kana)."""
    cjk = cjk_chars(text)
    if not cjk:
        return round(len(text.split()) * TOKENS_PER_WORD)
    rate = TOKENS_PER_JAPANESE_CHAR if _KANA.search(text) else TOKENS_PER_HAN_CHAR
    other = len(_HAS_CJK.sub(" ", text).split())  # the words between and around the CJK characters
    return round(other * TOKENS_PER_WORD + cjk * rate)
