"""Op families: importing this package registers every op (shape rule, pattern, numpy reference). One module per
family; compiler/compute/ holds each op's tensor-expression compute under the same family name."""

from compiler.graph.ops import conv, dense, elementwise, norm, pool, quantize, reduce, resize, transform  # noqa: F401
