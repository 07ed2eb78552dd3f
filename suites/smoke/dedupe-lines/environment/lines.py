"""Line helpers."""


def dedupe(lines):
    return sorted(set(lines))
