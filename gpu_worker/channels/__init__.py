"""Redis plumbing shared by web processes and workers: the signed control channel, token
streams, the Django-side K/V store access and the durable invalidation outbox.
"""
