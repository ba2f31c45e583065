"""The asyncio client of the mesh (see ``mesh.client.client``)."""

from mesh.client.client import EmbedResult, MeshClient

__all__ = ["EmbedResult", "MeshClient"]
