"""OpenAI-compatible servers: the engine, the HTTP client, launched servers, several servers for one arm."""
