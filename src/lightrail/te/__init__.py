"""Symphony: decentralized WAN traffic engineering (slice controllers, regularized TE, slicers)."""
