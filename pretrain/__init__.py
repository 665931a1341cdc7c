"""Pretraining: corpus cleaning (`pretrain.data`), the tokenizer, the model architectures, `forge plan`, and the
training loop."""
