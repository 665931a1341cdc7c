"""`forge data`: the corpus stage. Read top to bottom, in pipeline order:

stdlib_corpus.py  the embedded default corpus: stdlib docstrings (parsed with ast, never imported) + pydoc topics
ingest.py         directory/file reader (.txt .md .rst .html .htm .jsonl[.gz|.zst] .parquet .pdf .docx .odt .epub);
                  bad inputs -> skips
formats.py        DOCX, ODT, EPUB -> the Markdown-like text of textblocks.py (pdf.py: PDF, with PDFium)
sections.py       long documents cut into sections by headings, else at paragraphs, before the split
documents.py      a record as read -> its documents (converted, cut, sized); re-read for the Q&A stage
words.py          what a word is per script: whitespace, or rjieba / SudachiPy for Chinese and Japanese
drops.py          every way a document can be removed (FILTERS) and the record of one (Drop)
html.py           HTML: parsed, visible text, main content (trafilatura) rendered as textblocks.py's text
quality.py        the prose view and the quality rules (Gopher, C4, FineWeb; every rule measured, thresholds from
                  data.quality and data.profile, the rules' table in forge/quality_rules.py)
filters.py        the per-document steps in order: HTML extraction, boilerplate lines, metadata, language, quality
splits.py         train/val/test by a stable hash of the id, val and test sized to data.min_eval_tokens
calibrate.py      every rule measured on the train split; a rule that alone drops a large share is flagged
dedup.py          exact hash, MinHash + banded LSH (explicit bands x rows), verified Jaccard, union-find, paragraphs
paragraphs.py     paragraph dedup from sorted runs of hashes on disk: exact, bounded in memory
passes.py         the per-record passes as pure functions, the process pool
report.py         removal log (removed.jsonl.zst), report.json / report.md, removed_by_filter.png, calibration.png
pass_state.py     what each completed pass leaves under .work/, so a re-run resumes after it
stage.py          `run(cfg)`: ingest -> convert, cut, extract -> split -> clean -> dedup -> shards, through
                  forge.lineage.run_stage
"""
