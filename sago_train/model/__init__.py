"""Loading models, decoder layers, forward hooks, the tiny and the real model."""
