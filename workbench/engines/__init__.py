"""Inference engines behind one contract (`base.py`); look them up lazily via `registry.py`."""
