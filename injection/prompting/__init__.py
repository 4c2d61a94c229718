"""What the model reads: the chat template's injected system turn, history fitting, and
the output filter.
"""
