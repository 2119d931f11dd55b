"""What every backend shares: packed sequences, pooling, Dense heads, thread control, the int8
calibration recipe, length buckets for padded runs, strict weight loading, device choice."""
