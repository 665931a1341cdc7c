"""Forge: train and serve small domain language models.

The `forge` package is the thin shared layer under every stage: the typed run config (`forge.config`), the stage
table (`forge.stages`), run lineage and stage skipping (`forge.lineage`), atomic file writes (`forge.io`), content
hashes (`forge.hashing`), where runs live (`forge.paths`), MLflow tracking (`forge.tracking`) and the CLI
(`forge.cli`). It imports no stage package: the CLI and the pipeline reach each stage through the stage table.
The stage code lives in `pretrain` (plan, data, tokenizer, training loop), `evaluation`, `finetune`, `serve`;
`models` is the model-access layer they share.
"""

__version__ = "0.1.0"


class ForgeError(Exception):
    """An error a user can fix. The CLI prints its message on one line, without a traceback.

    The message names what is wrong (file, line or config field), the bad value, and the fix.
    """
