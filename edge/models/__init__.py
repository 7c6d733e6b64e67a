"""Several models side by side: what each serves from, who may use it, and what its tokens cost.

Each model gets its own replicas, dispatcher (queue, router, capacity) and Pipeline; the limiter is
shared, so a user's limits hold across models (a model's `token_weight` scales what its tokens
count). The catalog (catalog.py) picks a request's pipeline from its `model` and the key's tier.
"""
