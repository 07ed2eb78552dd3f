"""Containment: the rootless sandbox engine (engine.py), the filtering engine proxy in front of it,
the model relay and the per-run agent setup."""
