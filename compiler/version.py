"""The compiler's version: part of every bundle's identity and every tuning record, so a new compiler never serves a
bundle or applies a record an older one made under the same version only by accident. A leaf module: anything may
import it."""

COMPILER_VERSION = "0.1.0"
