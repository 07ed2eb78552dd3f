"""Build: the base images, the runner and API images as deterministic OCI layers, pushed by digest (build.py)."""
