"""NeoBERT for transformers (filled in by the foundation work)."""
