"""Evaluation: bits per byte, domain tasks and red flags of one model (the gate that judges them is registry/)."""
