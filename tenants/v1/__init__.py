"""The OpenAI-compatible API (``/v1``): chat completions (plain and streamed) and models.
"""
