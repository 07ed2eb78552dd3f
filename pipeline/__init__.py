"""benchseal: build, benchmark, sign and publish AI-agent releases by digest."""

__version__ = "0.1.0"
