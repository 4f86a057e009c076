"""The cluster spec: models, loading with line-numbered errors, cross-field checks, nodes."""

from provision.spec.loader import load_spec
from provision.spec.models import Profile, Spec
from provision.spec.nodes import Node, expand_nodes
from provision.spec.profiles import load_profiles

__all__ = ["Node", "Profile", "Spec", "expand_nodes", "load_profiles", "load_spec"]
