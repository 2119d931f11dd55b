"""Infinity's API: its /rerank and /classify bodies (paths shared with TEI and vLLM, the body
decides: api/clash.py); its /embeddings is OpenAI's route, and GET /models vLLM's listing."""
