"""Training with the stability loss: its settings, batch layout, loss terms, collator, trainer."""
