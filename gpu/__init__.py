"""Hardware oracle for fp8sim: CUDA kernels (CuPy), capture, verify, characterize."""
