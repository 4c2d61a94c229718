"""How prompts enter the running batch: paced chunks (``pacing``) and groups of rows
prefilled in one forward (``grouping``)."""
