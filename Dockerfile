# The runwatch image: one image for every runwatch service of docker-compose.yml
# (stream processors, query API + dashboard + exporter, trajectory API). Each service picks
# its `runwatch <command>` in the compose file.
#
#   docker build -t runwatch .                           # CPU services, no torch
#   docker build -t runwatch --build-arg EXTRAS=torch .  # + the torch trainer (large)
#
# Kafka, Prometheus and Grafana run from their own upstream images.
FROM python:3.11-slim-bookworm

ARG EXTRAS=""
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    RUNWATCH_LOG_DIR=/var/lib/runwatch/log

# libseccomp2: the sandbox's seccomp filter (pyseccomp loads it at run time).
RUN apt-get update \
 && apt-get install -y --no-install-recommends libseccomp2 \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/runwatch
# Only what the package needs (no tests, benchmarks or local data in the image).
COPY pyproject.toml README.md ./
COPY events ./events
COPY producers ./producers
COPY stream_processors ./stream_processors
COPY projections ./projections
COPY trainer ./trainer
COPY sandbox ./sandbox
COPY runwatch ./runwatch
RUN pip install ".${EXTRAS:+[$EXTRAS]}" \
 && runwatch --help > /dev/null

RUN useradd --system --uid 10001 --home-dir /var/lib/runwatch --create-home runwatch \
 && mkdir -p /var/lib/runwatch/log \
 && chown -R runwatch:runwatch /var/lib/runwatch
USER runwatch
WORKDIR /var/lib/runwatch
VOLUME ["/var/lib/runwatch"]

CMD ["runwatch", "--help"]
