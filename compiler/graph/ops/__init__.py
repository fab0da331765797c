"""Op families: importing this package registers every op (shape rule, pattern, numpy reference)."""

from compiler.graph.ops import elementwise, nn, reduce, transform  # noqa: F401
