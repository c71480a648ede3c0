"""The workbench: decide how to serve LLM-based generative recommenders.

Importing the package is light on purpose: no torch, no engine backends. Heavy modules are
imported where they are used (engines through `workbench.engines.registry`).
"""

__version__ = "0.1.0"
