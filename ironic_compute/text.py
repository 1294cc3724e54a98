"""Messages on one line: what every log line, fault and CLI error is made of."""


def one_line(message, limit=None):
    """``message`` (text or an exception) with its whitespace collapsed, at
    most ``limit`` characters (an exception without text: its class name)."""
    text = ' '.join(str(message).split())
    if not text and isinstance(message, BaseException):
        text = type(message).__name__
    if limit is not None and len(text) > limit:
        text = text[:limit - 3] + '...'
    return text
