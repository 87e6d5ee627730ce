"""SAGO evaluation: its settings, the extraction of activations/log-probs/generations, the evaluator."""
