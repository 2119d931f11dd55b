"""The transformers fallback: any architecture `transformers` can load, on padded batches."""
