# One image for the API and the workers. GPU nodes: build with
#   --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128
FROM python:3.11-slim
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
RUN apt-get update \
 && apt-get install -y --no-install-recommends libsodium23 curl \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /srv/tensor-registry
COPY pyproject.toml constraints.txt README.md ./
COPY app ./app
COPY workers ./workers
COPY migrations ./migrations
COPY frontend ./frontend
RUN pip install --no-cache-dir --index-url "$TORCH_INDEX" torch==2.13.0 \
 && pip install --no-cache-dir -c constraints.txt ".[worker]"
ENV TENSOR_REGISTRY_DATA_DIR=/var/lib/tensor-registry
EXPOSE 8000
CMD ["tensor-registry", "serve", "--host", "0.0.0.0", "--no-worker", "--no-migrate"]
