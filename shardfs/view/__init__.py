"""The unsharded view: virtual namespace, resolution and caches (no FUSE here)."""

from shardfs.view.base import Reader
from shardfs.view.namespace import Namespace
from shardfs.view.nodes import Attr, Node, Role
from shardfs.view.presentation import View

__all__ = ["Attr", "Namespace", "Node", "Reader", "Role", "View"]
