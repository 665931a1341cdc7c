"""Supervised fine-tuning with TRL on domain Q&A pairs (full, LoRA, QLoRA)."""
