"""memsvc: a memory service for LLM applications."""
