"""CLI verbs; see ``pipeline.cli.main``."""
