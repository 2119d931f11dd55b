"""The serving pipeline: admission, tokenization, batching, the backend worker, post-processing."""
