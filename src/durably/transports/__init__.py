"""Transports: tools that call other services, carrying each call's idempotency key.

- :func:`http_tool` (``durably.transports.http``): one HTTP request per call,
  the key in the ``Idempotency-Key`` header; needs the ``http`` extra (httpx).
- :func:`mcp_tools` (``durably.transports.mcp``): an MCP server's tools, the key
  in the request's ``_meta``; needs the ``mcp`` extra.

Both import their third-party package only when used.
"""

from .http import IDEMPOTENCY_HEADER as IDEMPOTENCY_HEADER
from .http import HttpToolError as HttpToolError
from .http import http_tool as http_tool
from .mcp import META_KEY as META_KEY
from .mcp import McpSession as McpSession
from .mcp import McpToolError as McpToolError
from .mcp import mcp_tools as mcp_tools

__all__ = [
    "IDEMPOTENCY_HEADER",
    "META_KEY",
    "HttpToolError",
    "McpSession",
    "McpToolError",
    "http_tool",
    "mcp_tools",
]
