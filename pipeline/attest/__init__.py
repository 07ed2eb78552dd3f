"""Image signatures and attestations with cosign, keyless (images.py)."""
