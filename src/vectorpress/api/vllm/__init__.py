"""vLLM's pooling API: /score, /classify, /detokenize, /v1/models; its /v1/rerank and /v2/rerank
are Cohere's routes (same fields), and `truncate_prompt_tokens` rides on /v1/embeddings."""
