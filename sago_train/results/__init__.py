"""The record of an evaluation, in memory and on disk, and its store."""
