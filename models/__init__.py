"""The one way Forge opens and uses a model: a Hugging Face directory or a GGUF file, and the model families.

    from models.access import open_model
    model = open_model("runs/tiny-cpu/sft/model")            # or "model-q4_k_m.gguf" (llama.cpp)
    ids = model.encode("What does len() return?")            # the model's own tokenizer
    model.perplexity(ids, window=256, stride=128).ppl        # sliding-window perplexity (models/perplexity.py)
    model.generate(ids, 32)                                  # greedy; sampling with temperature/top_k/seed

  access.py      open_model, Backend (HFBackend, GGUFBackend): tokenize, logits, scores, generation, chat template
  perplexity.py  the sliding-window perplexity both backends share
  gguf.py        GGUF integrity check, metadata, loading through llama.cpp
  families.py    one architecture spec per model family (llama, gpt2): HF config, feed-forward rule, memory terms,
                 decoder-layer path, GGUF hyperparameters and tensor transforms

Evaluation, quantization and serving all go through here; nothing else loads a model for inference.
"""

# The files of a Hugging Face tokenizer (any of them may be absent): what is copied beside a model's weights and
# what the registry carries, for Forge's own tokenizer and for a base model's (BPE vocab/merges, SentencePiece).
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "chat_template.json",
    "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model",
)  # fmt: skip
