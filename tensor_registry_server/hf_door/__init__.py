"""The Hugging Face door: the read side of the Hub's HTTP API over the registry's models."""
