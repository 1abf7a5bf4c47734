"""The error the server turns into HTTP 400."""


class GrammarError(ValueError):
    """An invalid grammar or JSON schema; the message is the parser's."""
