"""The run's domain Q&A set (`forge qa`): what SFT trains on and what evaluation scores, built after `forge data`.

    forge qa --config configs/tiny-cpu.yaml                  # qa.source=auto: the embedded corpus's own set
    forge qa --set data.inputs='[manual/]'                   # auto: pairs extracted from your corpus
    forge qa --set qa.source=my_pairs.jsonl                  # your own pairs, always preferred

Sources (`qa.source`): `corpus` (pretrain/qa/corpus.py: pairs from the document structure, answers checked against
the cleaned text), `builtin` (pretrain/qa/builtin.py: the embedded stdlib set), a JSONL file (pretrain/qa/records.py),
`auto` (builtin for the embedded corpus, corpus otherwise). The embedded set is refused for any other corpus, here
and in sft and eval: it would train and judge the wrong domain.

Outputs in runs/<run>/qa/:
  qa_train.jsonl   the pairs SFT trains on
  qa_eval.jsonl    the held-out pairs `forge eval` scores: from val/test documents only (corpus), held-out objects
                   (builtin) or held-out questions (a file), never in qa_train.jsonl, decontaminated against it
  report.json, report.md   pairs by kind, 10 samples of each, what was skipped and why
  config.yaml, manifest.json   as every stage (the manifest's sha256 of the two files is the Q&A set's identity)

One JSON object per line, UTF-8, readable and editable (give an edited copy back as `qa.source`):

  question  str         what the user asks (the last user turn of a conversation)
  answer    str         the reference answer (the last assistant turn): text of the corpus, for extracted pairs
  qtype     str | null  the kind of question: purpose, description, overview, synopsis, declaration, option,
                        argument, definition, example, faq, details, section, default, context, module, field
                        (corpus, see pretrain/qa/extract.py); describe, details, members, module (builtin); the
                        line's own value or null (a file). Evaluation reports its metrics per qtype.
  source    object      where the pair comes from:
              kind     "corpus" | "builtin" | "file"
              doc_id   the data stage's document id (corpus, builtin), else null
              split    that document's split: train, val or test (a file's pairs: null)
              heading  the section heading (corpus), the documented object (builtin), else null
              path     the input file of the document (corpus) or the JSONL file (a file), else null
              line     the line of the JSONL file (a file), else absent
              origin   the line's own "source" object, when it had one (an edited copy of a generated set)
  messages  list       only for conversations: [{"role": "system"|"user"|"assistant", "content": str}, ...]
  ...                  any other key of a user's line is kept as it was (builtin pairs add object and kind)
"""
