"""Public datasets converted into Harbor-format task directories (importers; the digest is core's)."""
