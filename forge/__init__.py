"""Forge: train and serve small domain language models.

The `forge` package is the thin shared layer: the typed run config (`forge.config`), run lineage and stage
skipping (`forge.lineage`), MLflow tracking (`forge.tracking`) and the CLI (`forge.cli`). The stage code lives in
the stage packages: `pretrain` (data, tokenizer, model, plan, training loop), `finetune`, `evaluation`, `serve`.
"""

__version__ = "0.1.0"


class ForgeError(Exception):
    """An error a user can fix. The CLI prints its message on one line, without a traceback.

    The message names what is wrong (file, line or config field), the bad value, and the fix.
    """


class NotBuiltYet(ForgeError):
    """A stage whose issue has not landed yet."""
