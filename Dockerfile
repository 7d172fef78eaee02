# The headwater services: `headwater index` and `headwater serve` (helm/headwater and
# deploy/compose.yaml run them). No Java: neither starts Spark (`headwater compact` does,
# and is not run from this image), nor the embedded stack's broker and graph server (their jars
# are fetched by `headwater stack up`, never here). docker build -t headwater:0.1.0 .
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY headwater headwater
COPY capture capture
COPY indexer indexer
COPY query query
COPY store store
COPY deploy deploy
RUN python -m venv /opt/headwater \
 && /opt/headwater/bin/pip install --no-cache-dir --progress-bar off .

FROM python:3.11-slim
RUN groupadd --system --gid 10001 headwater \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/headwater --create-home headwater
COPY --from=build /opt/headwater /opt/headwater
ENV PATH=/opt/headwater/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HEADWATER_HOME=/var/lib/headwater
USER 10001:10001
WORKDIR /var/lib/headwater
# query service HTTP (and its /metrics); the indexer's metrics and health; the narrower's
EXPOSE 8080 9101 9102
ENTRYPOINT ["headwater"]
CMD ["--help"]
