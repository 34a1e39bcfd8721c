"""`cuca serve`: an OpenAI-compatible HTTP server (Starlette on uvicorn) for one model. Needs the `serve` extra
(`pip install "cuca[serve]"`): `cuca.serve.app` imports Starlette, this package itself imports nothing heavy."""
