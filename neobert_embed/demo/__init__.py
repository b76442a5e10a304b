"""The embedded default pipeline (`neobert-embed demo`)."""
