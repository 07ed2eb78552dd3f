"""Evidence: summary, SBOMs, provenance, checksums and Sigstore bundles of a graded run (writer.py)."""
