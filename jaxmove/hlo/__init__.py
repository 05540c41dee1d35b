"""HLO IR and text parser. Knows nothing of JAX."""

from .errors import HloParseError
from .ir import Computation, Instruction, Metadata, Module, SourceLocation
from .parser import parse_file, parse_module
from .shape import HOST_MEMORY_SPACE, PRIMITIVE_BIT_WIDTHS, Layout, Shape, array_shape

__all__ = [
    "HloParseError", "Computation", "Instruction", "Metadata", "Module", "SourceLocation",
    "parse_file", "parse_module", "HOST_MEMORY_SPACE", "PRIMITIVE_BIT_WIDTHS", "Layout", "Shape",
    "array_shape",
]
