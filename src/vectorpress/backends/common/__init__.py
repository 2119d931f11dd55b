"""What every backend shares: packed sequences, pooling and heads."""
