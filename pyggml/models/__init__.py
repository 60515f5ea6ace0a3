"""Models from outside the package: the Hugging Face hub (hub.py)."""
