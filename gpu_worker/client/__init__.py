"""The worker's client port, run in the web process: dispatch a chat and wait for it, or
relay its streamed pieces (installed into ``tenants.ports`` by ``gpu_worker.apps``).
"""
