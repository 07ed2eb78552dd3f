"""Verification of a published release (release.py), its policy and the external verifiers."""
