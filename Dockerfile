# One Dockerfile, two targets:
#   runtime (default)  the API, `migrate` and the plain worker
#   vllm               runtime + vLLM, for workers that make --format vllm artifacts
#
# Build arguments:
#   TORCH_INDEX_URL  where torch comes from. CPU build (default):
#                      https://download.pytorch.org/whl/cpu
#                    GPU workers: the CUDA build matching the host driver, e.g.
#                      https://download.pytorch.org/whl/cu130   (driver >= 580; what vLLM's wheels link)
#                      https://download.pytorch.org/whl/cu128   (driver >= 570; no vLLM target)
#   TORCH_VERSION    must match constraints.txt (vLLM pins torch exactly: 0.27-0.30 -> 2.13.0)
#   VLLM_VERSION     vllm target only
# docker-compose.yml passes them from .env (see .env.example).
FROM python:3.11.11-slim-bookworm AS runtime
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.13.0
RUN apt-get update \
 && apt-get install -y --no-install-recommends libsodium23 curl \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 registry \
 && useradd --system --uid 10001 --gid 10001 --home-dir /home/registry --create-home registry \
 && install -d -o 10001 -g 10001 -m 0700 /var/lib/tensor-registry
WORKDIR /srv/tensor-registry
COPY pyproject.toml constraints.txt README.md ./
COPY client ./client
COPY tensor_registry ./tensor_registry
COPY tensor_registry_server ./tensor_registry_server
RUN pip install --no-cache-dir --index-url "$TORCH_INDEX_URL" "torch==$TORCH_VERSION" \
 && pip install --no-cache-dir -c constraints.txt ./client ".[worker]"
ENV TENSOR_REGISTRY_DATA_DIR=/var/lib/tensor-registry
EXPOSE 8000
# Every container runs unprivileged; numeric, so Kubernetes' runAsNonRoot can verify it.
USER 10001:10001
CMD ["tensor-registry", "serve", "--host", "0.0.0.0", "--no-worker", "--no-migrate"]

FROM runtime AS vllm
ARG VLLM_VERSION=0.30.0
# The torch installed above satisfies vLLM's exact pin, so pip keeps the CUDA build.
USER root
RUN pip install --no-cache-dir -c constraints.txt "vllm==$VLLM_VERSION"
USER 10001:10001
CMD ["tensor-registry", "worker", "--queues", "gpu", "--concurrency", "1"]
