"""Evaluation: perplexity, domain tasks, red flags and the promotion gate policy."""
