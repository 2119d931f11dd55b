"""Batch jobs: `vectorpress embed` over files, on this machine or on a Ray cluster."""
