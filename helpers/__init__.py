"""Shared code for the course notebooks.

Importing this package does nothing by itself (no seeds, no downloads, no global
settings); import the submodule you need, for example ``from helpers.models import
build_model``.
"""
