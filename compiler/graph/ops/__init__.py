"""Op families: each module registers its ops (shape rule, pattern, numpy reference)."""
