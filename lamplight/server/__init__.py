"""The HTTP layer: OpenAI- and llama-server-compatible endpoints over the engine.

Start with `app.create_app(ServerState(settings))`; `launcher.serve()` runs it with uvicorn while
the model loads in the background. Module map:

- app, middleware: the FastAPI application, CORS / API key / readiness rules, error shapes
- routes_openai, routes_native, routes_misc: the endpoints
- completion_flow: what every generating endpoint does (parse, prepare, submit, answer or stream)
- chat_bridge, api_anthropic*, api_responses*, api_ollama*: the other APIs, converted onto the chat pipeline
- params, fields, constraints, prepare, prompts, chat_prompt, infill: request bodies -> engine requests
- generation: engine handles of one request, merged events, cancellation
- responses_native, responses_openai, probs, generation_settings: JSON result shapes
- stream_formats, sse: streamed answers
- settings (incl. RequestLimits), state, errors, json_codec, json_io, model_info, memory, metrics, launcher: the rest
- connections: idle and request-head timeouts for uvicorn's connections
"""

from .app import create_app
from .settings import ServerSettings
from .state import ServerState

__all__ = ["ServerSettings", "ServerState", "create_app"]
