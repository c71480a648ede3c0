"""The study's stages, one module each, in pipeline order (`names.STAGES`); `pipeline.py` runs them."""
