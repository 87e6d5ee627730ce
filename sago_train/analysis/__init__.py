"""Comparing, ranking and reporting recorded evaluations."""
