"""What the test suite and the benchmarks both start: a real `tensor-registry serve`
process (serve_process), HTTP servers on loopback (loopback), a stand-in vLLM
(vllm_standin), and waiting for a state instead of sleeping (waiting). Not shipped:
neither distribution packages this folder."""
