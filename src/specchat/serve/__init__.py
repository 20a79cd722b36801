"""`specchat serve`: an OpenAI-compatible HTTP server over the same models and engines as the chat."""
