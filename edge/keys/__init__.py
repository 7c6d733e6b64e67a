"""API keys in a store every edge shares (SQLite embedded, DynamoDB in production), looked up through
a short cache, and their lifecycle (create, list, revoke, rotate, set-tier). Only SHA-256 hashes of
keys are ever stored."""
