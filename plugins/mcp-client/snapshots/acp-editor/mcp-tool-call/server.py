"""The scenario's MCP server (the official SDK, stdio): one read-only tool over fixed notes."""

from mcp.server import MCPServer
from mcp_types import ToolAnnotations

NOTES = {"release": "ship 1.2 on Friday after the changelog review", "lunch": "tacos on Tuesday"}

app = MCPServer("notes")


@app.tool(annotations=ToolAnnotations(read_only_hint=True))
def search_notes(query: str) -> str:
    """Search the user's notes for a word; answers the matching notes."""
    return "; ".join(text for key, text in NOTES.items() if query.lower() in key) or "no note matches"


if __name__ == "__main__":
    app.run()
