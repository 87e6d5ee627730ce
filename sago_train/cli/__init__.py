"""The ``sago-train`` command line."""
