"""Adapters that turn each archive format into entries the mount serves."""
