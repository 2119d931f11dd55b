"""Wire dialects: thin adapters from a wire format to `Infer` and back."""
