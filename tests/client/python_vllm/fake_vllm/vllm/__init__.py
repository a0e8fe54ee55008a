"""A stand-in for vLLM in the plugin's tests: only the names attnd_vllm touches, with the
signatures of the vLLM source named in docs/VLLM.md. Not vLLM code."""
