"""OpenAI's embeddings dialect."""
