"""Stand-in vllm.platforms: current_platform answers is_rocm() from ROCM (tests set it) and
fp8_dtype() with the name of the platform's fp8 (FP8_DTYPE, e4m3fn unless a test sets fnuz)."""

ROCM = False
FP8_DTYPE = "torch.float8_e4m3fn"


class _Platform:
    def is_rocm(self):
        return ROCM

    def fp8_dtype(self):
        return FP8_DTYPE


current_platform = _Platform()
