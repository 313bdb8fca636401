# One image for web, CPU workers and GPU workers. The GPU worker runs the same image on the NVIDIA runtime: torch's
# CPU build is pinned here for size; a GPU deployment overrides TORCH_SPEC with a CUDA build at build time.
FROM python:3.11-slim
ARG TORCH_SPEC="torch==2.13.0"
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 TANDEM_DATA_DIR=/data HF_HUB_OFFLINE=1 TANDEM_COLLECTED_STATIC=true
WORKDIR /app
RUN apt-get update && apt-get install -y --no-install-recommends curl && rm -rf /var/lib/apt/lists/*
# Unquoted on purpose: the GPU build passes "torch==… --index-url …".
RUN pip install $TORCH_SPEC
COPY pyproject.toml constraints.txt README.md ./
COPY feedback_app feedback_app
COPY training training
COPY reward_models reward_models
COPY templates templates
COPY static static
COPY manage.py ./
RUN pip install -c constraints.txt -e .
RUN DEBUG=false SECRET_KEY=build-only python manage.py collectstatic --noinput
EXPOSE 8000
CMD ["gunicorn", "feedback_app.wsgi", "--bind", "0.0.0.0:8000", "--workers", "3", "--threads", "4"]
