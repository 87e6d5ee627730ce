"""sago_train"""
from .version import __version__

