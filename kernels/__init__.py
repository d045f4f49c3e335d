"""Hot kernels with a portable fallback (MinHash signatures, attention); imports no other package."""
