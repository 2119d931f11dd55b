"""Cohere's rerank and embed API, v2 and v1: /v2/rerank, /v2/embed, /v1/rerank, /v1/embed."""
