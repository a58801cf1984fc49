# The suite's image for the docker-compose Locust master and workers.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY locustfiles ./locustfiles
COPY analysis ./analysis
COPY embedded_vllm ./embedded_vllm
COPY vllm_loadtest ./vllm_loadtest
RUN pip install --no-cache-dir .
EXPOSE 8089 5557
