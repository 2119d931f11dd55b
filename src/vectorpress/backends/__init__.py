"""Backends turn a packed Batch into vectors or scores."""
