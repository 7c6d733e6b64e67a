"""Conversation history: stores (SQLite embedded, DynamoDB in production) and the background writer."""
