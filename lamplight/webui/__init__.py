"""The browser chat page served at `/` (static files in static/, no build step)."""
