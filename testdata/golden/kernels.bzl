"""The CPU kernels the golden files were recorded with (README.md here): the environment of every
test that compares Keel with them bit for bit. ATen's float reductions sum in the order of its
vector width, and MKL's float64 sqrt rounds otherwise on wider instruction sets."""

GOLDEN_KERNELS_ENV = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "AVX2",
}
