"""Hugging Face Trainer integration: the SAGO callback, its monitor, early stopping, W&B."""
