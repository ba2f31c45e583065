"""The asyncio client of the mesh (see ``mesh.client.client``)."""

from mesh.client.client import EmbedResult, MeshClient
from mesh.client.request import ValidRequest

__all__ = ["EmbedResult", "MeshClient", "ValidRequest"]
