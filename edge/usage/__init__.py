"""Tokens used per user, model and UTC day: recorded when a request settles, off the token path."""
