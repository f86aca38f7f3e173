"""The real GPU backend: Triton paged-attention kernels, a paged KV cache, a random-weight decoder, and an
executor that runs StepPlans on them and measures the time. Imports torch; the simulator imports it lazily."""
