"""Jina's API: its rerank body and answer are those of /v1/rerank (api/cohere/routes.py serves
both shapes at once); its embeddings extras ride on OpenAI's /v1/embeddings (`jina.extras`)."""
